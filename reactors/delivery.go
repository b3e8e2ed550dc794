package reactors

import (
	"encoding/json"
	"sort"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// ChildResultMessage is the mailbox message reporting a terminal child.
// It always fits in one message (events.MaxMessageBytes): when the whole
// report does not, its output is left out, its summary, error and reason
// cut and effects left off from the end until it does, and it says
// Truncated; the parent reads the full result from the child task
// (TaskID).
func ChildResultMessage(child aggregate.State) events.Message {
	return childResultMessage(events.ChildResult{TaskID: child.TaskID, Status: string(child.Status), Reason: child.Reason, Result: child.Result})
}

// childResultMessage is the mailbox message of report, cut to fit.
func childResultMessage(report events.ChildResult) events.Message {
	full, reason := report.Result, report.Reason
	text, fits := childReportText(report)
	// Keep less of each text every round; with nothing kept it fits.
	for keep := 4 << 10; !fits; keep /= 4 {
		report.Truncated = true
		report.Reason = events.Truncate(reason, keep)
		if full == nil {
			text, fits = childReportText(report)
			continue
		}
		r := *full
		r.Output = nil // up to 256 KiB: never worth the texts
		r.Summary, r.Error = events.Truncate(r.Summary, keep), events.Truncate(r.Error, keep)
		report.Result = &r
		// The fewest effects that do not fit, less one: the most that do.
		n := sort.Search(len(full.Effects)+1, func(n int) bool {
			r.Effects = full.Effects[:n]
			_, ok := childReportText(report)
			return !ok
		}) - 1
		if n >= 0 {
			r.Effects = full.Effects[:n]
			text, fits = childReportText(report)
		}
	}
	return events.Message{
		ID:      events.ChildResultID(report.TaskID),
		Content: []events.ContentPart{{Type: events.ChildResultType, Text: text}},
	}
}

// childReportText is the report's JSON and whether it fits in a mailbox
// message.
func childReportText(r events.ChildResult) (string, bool) {
	text, _ := json.Marshal(r)
	return string(text), len(events.ChildResultType)+len(text) <= events.MaxMessageBytes
}
