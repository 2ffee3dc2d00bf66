"""The database layer: schema, transactions, drivers.

SQLAlchemy's pool logs what it handles itself with a traceback: a rollback
that fails as a connection comes back to the pool (the server ended it
mid-transaction: "Exception during reset or similar"), just before the pool
discards that connection. With no handler of the program's, Python's
last-resort handler would print that traceback on stderr, beside the error
spoolctl reports in its own words (and between the JSON lines of
`work --log-format json`). Nothing is lost by dropping it: the statement that
met the lost connection raises, and that error is the one reported.
"""

import logging

logging.getLogger("sqlalchemy.pool").addHandler(logging.NullHandler())
