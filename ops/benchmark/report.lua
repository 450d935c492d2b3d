-- wrk script: after the run, print one JSON line with counts and latency percentiles (us).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"duration_us": %d, "requests": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"mean": %.1f, "max": %d, "p50": %d, "p90": %d, "p99": %d, "p999": %d}}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
