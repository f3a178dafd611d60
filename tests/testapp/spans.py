"""OpenTelemetry's SDK in a worker subprocess, its spans written to a file the test reads (one JSON
object per line), so a trace that crosses processes can be put together again."""

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def __init__(self, path):
        self.path = path

    def export(self, spans):
        with open(self.path, "a") as file:
            for span in spans:
                file.write(json.dumps({
                    "name": span.name, "pid": os.getpid(),
                    "trace_id": f"{span.context.trace_id:032x}", "span_id": f"{span.context.span_id:016x}",
                    "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                    "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
                }) + "\n")
        return SpanExportResult.SUCCESS


def export_to_file(path):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    trace.set_tracer_provider(provider)


def read(path):
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]
