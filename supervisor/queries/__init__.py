"""SQL statements, one module per table (or group of tables that change together)."""
