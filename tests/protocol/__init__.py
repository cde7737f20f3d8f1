"""Tests of the shared protocol package (pagedserve.protocol): its domain types and codecs."""
