"""The journal service: FETCH ranges of live topics (see :mod:`journal.service`)."""
