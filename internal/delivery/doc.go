// Package delivery is the ready queue end to end: the ready stream
// (EnsureStream), the publisher of ready notifications (Publisher), and
// per queue the dispatcher that hands notifications, and released
// deliveries without one, to the claimers waiting in this process
// (Queues, Dispatcher).
package delivery
