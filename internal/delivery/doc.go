// Package delivery is the ready queue end to end: the ready stream
// (EnsureStream), the publisher of ready notifications (Publisher), and,
// per queue, the dispatcher that hands notifications, and released
// deliveries without one, to the claimers waiting in this process
// (Queues, Dispatcher). The scheduler's claims wait on it through a small
// interface of its own; the alarm publishes through Publisher and offers
// each release to Queues.HoldOrHandoff (reactors.AlarmConfig.Handoff).
// What executors share of it, the consumer, is package ready; the
// notification's body and subjects are package events'.
//
// # Ready notifications
//
// Ready notifications go to a work-queue stream of their own, apart from
// the log: they carry no truth, only permission to try a claim with a
// delivery token, and a notification is gone once a claimer acknowledged
// it. Notifications are at-least-once: a republish within the 2-minute
// duplicate window is dropped by the ready stream (the same message id),
// a later duplicate (two processes, a crash between publish and
// ReadyPublished) is stale and its claim answers 409. Every claimer of a
// queue, in any process and any NATS-mode executor, shares the durable
// pull consumer ready_<queue> (ready.ConsumerConfig: explicit ack, ack
// wait 30 s, deleted by the server after --queue-idle, 1 h, without a
// pull). claims/next takes one notification at a time, claims, and acks
// on success or on a stale token; a customer principal leaves other
// customers' notifications. Publisher.ReadyStored is the alarm's
// republish check: a notification the stream no longer holds at the
// sequence ReadyPublished recorded (or holds for another delivery, after
// the stream was deleted and created again) is published again.
//
// # The dispatcher
//
// claims/next and batch claims wait on one Dispatcher per queue and
// process. It pulls from the queue's shared durable consumer only while
// claimers wait, asking for as many notifications as they want (at most
// 16 pulls of up to 1,000 in flight), and hands each to exactly one
// waiter, the first in line that may claim it (an operator any, a
// customer only its own). A waiting claimer costs a list element and a
// channel, never a pull request of its own. A notification nobody here
// may take is parked for the next waiter for up to 100 ms (at most 1,000
// parked), then handed back to the consumer for other processes. The
// wait's deadline or shutdown ends the wait, never a claim under way;
// shutdown (Queues.Close) waits for the pulls in flight and hands back
// what they bring. The first claim on a queue creates its consumer
// (InactiveThreshold --queue-idle); a dispatcher that has not pulled for
// half of that makes sure the consumer exists again before pulling.
//
// # Handoff and hold
//
// Before a released delivery is published (for the schedule call of a
// task due at once, Queues.Release; by the alarm right after its
// release, Queues.HoldOrHandoff), it is offered to its queue's dispatcher
// here: a claimer that may claim it and waits in line gets it as if it
// had pulled its notification (Offer.Msg is nil), and nothing is
// published. The log after a handoff is the log after a crash between a
// release and its publish, so a handed claim that fails is published by
// the alarm's delivery queue after its grace. A delivery the alarm
// releases while no claimer that may claim it waits, but one joined the
// line within the last 50 ms, is held for the next such claimer for up to
// 50 ms (at most 1,000 per queue and process) and only then published,
// with its ReadyPublished, as the alarm would have; shutdown drops the
// held ones, which the alarm publishes after its grace. The schedule call
// does not hold, and does not wait for a publish either: Release queues
// the delivery for a pool of publishers (16, with room for 4,096 waiting;
// past that the schedule call publishes itself), and the answer goes out
// as soon as the task is on the log. A crash, or a shutdown, before the
// publish leaves it to the alarm's grace, as after a crash today. docs/DESIGN.md, "Handoff" under "The alarm", says what
// this saves.
package delivery
