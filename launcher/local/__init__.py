"""Private local instances of the platform's servers: a Kafka broker and PostgreSQL.

Used by ``candlewire up`` and by the tests, which start their own on free ports.
"""
