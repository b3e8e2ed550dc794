// Package bench holds taskledger's end-to-end benchmarks: raw JetStream
// append rates, loading a task from a large log and claim throughput
// through the store, each against its own embedded NATS server, plus
// micro-benchmarks of the codec and the aggregate. It has no non-test
// code; run it with `make bench` (BENCH_SCALE scales the work, default 1).
package bench
