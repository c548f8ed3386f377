"""Models of the console app."""
