"""The leaf package: event and record models, Arrow schemas, encodings."""
