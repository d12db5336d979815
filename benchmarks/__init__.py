"""Side-by-side measurements; not run as tests."""
