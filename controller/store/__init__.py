"""The only package that touches the database: SQLAlchemy models, the engine, and
repository functions. Repository functions take a Session and never commit: the
caller owns the transaction (``with store.transaction() as tx``)."""
