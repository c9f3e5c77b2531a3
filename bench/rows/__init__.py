"""The rows of the comparison table (one module per system under test)."""
