"""Data into and out of a run, driver side: ``staging`` (``tfnb.stage``), ``feeding`` (``tfnb.run(data=df)``),
``inference`` (``tfnb.predict``, over ``scoring`` in the Spark Python workers and ``model``)."""
