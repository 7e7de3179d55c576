"""The Kafka transport: settings, the producers' outbox and publisher, message signing and
numbering, the transactional worker and the sink's consumer. Everything else in gpucost runs
without a broker (the operators, the embedded run, the Parquet sink, the views)."""
