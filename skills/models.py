"""Models of the skills app."""
