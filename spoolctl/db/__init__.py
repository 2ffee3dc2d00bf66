"""The database layer: schema, transactions, drivers."""
