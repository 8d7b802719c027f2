"""Validation against published measurements: the rows (`measurements.toml`), moejax's
prediction for each (`predict`), and the table, CSV and plot (`table`)."""
