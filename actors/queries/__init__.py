"""Every SQL statement of the price tracker, one module per group of tables."""
