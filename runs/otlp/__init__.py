"""OTLP transports of the runs app: what agents instrumented elsewhere send in.
`door` checks a caller once for every transport (OTLP/HTTP and OTLP/gRPC),
`logs_api` is `POST /v1/logs`, `grpc_server` the OTLP/gRPC receiver
(`manage.py otlp_grpc`); all of them hand checked spans and log records to
`runs.services.external` / `runs.services.external_logs`."""
