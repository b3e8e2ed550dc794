package eventlog

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// replyMsg is a delivered message with only a reply subject.
type replyMsg struct {
	jetstream.Msg
	reply string
}

var errNoMetadata = errors.New("no metadata")

func (m replyMsg) Reply() string { return m.reply }

func (m replyMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errNoMetadata }

func TestStreamSeq(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, reply string
		want        uint64
	}{
		{"V1", "$JS.ACK.EVENTS.oc_1.1.4711.4711.1733000000000000000.0", 4711},
		{"V2", "$JS.ACK.hub.ACCHASH.EVENTS.oc_1.1.42.40.1733000000000000000.3", 42},
		{"V2WithToken", "$JS.ACK.hub.ACCHASH.EVENTS.oc_1.2.9007199254740993.7.1733000000000000000.0.xyz", 9007199254740993},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := streamSeq(replyMsg{reply: tc.reply})
			if err != nil || got != tc.want {
				t.Fatalf("streamSeq(%q) = %d, %v; want %d", tc.reply, got, err, tc.want)
			}
		})
	}
	// Anything else is left to nats.go's Metadata.
	for _, reply := range []string{"", "_INBOX.x", "$JS.ACK.EVENTS.oc_1.1.x.1.1.0", "$JS.ACK.a.b.c.d.0.1.1.1", "$JS.ACK.a.b.c.d.e.f.g.h.i.j"} {
		if _, err := streamSeq(replyMsg{reply: reply}); !errors.Is(err, errNoMetadata) {
			t.Errorf("streamSeq(%q): err %v, want Metadata's", reply, err)
		}
	}
}
