"""Tests of the journal: storage, summaries, redaction and `smg journal`."""
