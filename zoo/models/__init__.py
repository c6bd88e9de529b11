"""Model families as plain single-device modules (one file per family), their named sizes and
their forward as a list of layers (`stages.py`)."""
