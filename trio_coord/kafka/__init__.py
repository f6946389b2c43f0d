"""The Kafka front end: a second listener that speaks the Kafka protocol to the same broker.

Kafka clients (librdkafka/confluent-kafka, aiokafka, kafka-python, kcat)
produce to and fetch from the same topics and partition logs as native
clients. The modules: ``listener`` (connections, framing, ordering),
``codec`` (kio's generated schemas), ``dispatch`` (which API goes where),
``service`` (the typing.Protocol of the broker the handlers depend on),
``metadata``, ``produce``, ``fetch`` and ``admin`` (the handlers),
``partitions`` (the per-partition checks), ``records`` (RecordBatch v2)
and ``errors`` (Kafka's error codes). ``docs/kafka.md`` lists every API and
where this broker differs from Apache Kafka.

Nothing is imported here: a broker without a Kafka listener never loads kio
(which, where hypothesis is installed, imports it and pytest with it).
"""
