"""Data into and out of a run, driver side: ``staging`` (``tfnb.stage``), ``feeding`` (``tfnb.run(data=df)``),
``inference`` (``tfnb.predict``)."""
