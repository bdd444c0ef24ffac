"""The output formats the CLI offers, apart from :mod:`launcher.render`: every service starts
through the CLI, and its argument parser should not import pyarrow and pandas to list them."""

FORMATS = ("table", "csv", "json", "parquet")  # history's; "table" prints, the rest write
WATCH_FORMATS = ("text", "json")  # watch's: aligned human lines, or one JSON object a line
