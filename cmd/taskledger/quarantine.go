package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// quarantinedMessage is one line of replay quarantine: a message of the
// log that does not decode, which the server skips (quarantines).
type quarantinedMessage struct {
	Seq      uint64    `json:"seq"` // its log position
	Subject  string    `json:"subject"`
	Customer string    `json:"customerId,omitempty"` // of a task subject
	Task     string    `json:"taskId,omitempty"`
	At       time.Time `json:"at"` // when the log stored it
	Bytes    int       `json:"bytes"`
	Reason   string    `json:"reason"`
}

// quarantineCommand lists every message of the log that does not decode
// (taskledger replay quarantine): what the server quarantines, the task
// each is on, and why. It reads the whole log as replay verify does and
// changes nothing; it exits 0 whether it finds any or not.
func quarantineCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("replay quarantine")
	var off offline
	off.register(fs)
	asJSON := fs.Bool("json", false, "one JSON object per quarantined message (NDJSON)")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, closeLog, err := off.openLog(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	bar := newProgress("quarantine")
	var found, read int
	err = log.Read(ctx, eventlog.ReadOptions{Progress: bar.update}, func(m eventlog.Message) error {
		read++
		_, err := events.DecodeAt(m.Data, m.Pos)
		if err == nil {
			return nil
		}
		found++
		q := quarantinedMessage{Seq: uint64(m.Pos), Subject: m.Subject, At: m.Time.UTC(), Bytes: len(m.Data), Reason: err.Error()}
		q.Customer, q.Task, _ = events.TaskSubject(m.Subject)
		if *asJSON {
			return json.NewEncoder(stdout).Encode(q)
		}
		_, err = fmt.Fprintf(stdout, "seq %d %s task %s stored %s, %d bytes: %s\n", q.Seq, q.Subject, or(q.Task, "-"), q.At.Format(time.RFC3339), q.Bytes, q.Reason)
		return err
	})
	bar.done()
	if err != nil {
		return err
	}
	if !*asJSON {
		noun := "messages"
		if read == 1 {
			noun = "message"
		}
		fmt.Fprintf(stdout, "%d %s read, %d quarantined (they do not decode; every read of the server skips them)\n", read, noun, found)
	}
	return nil
}
