package replay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/replay"
)

// chainKeys returns a keyring of the keys ids, each secret the id's byte
// repeated, so two keyrings of one id agree.
func chainKeys(t *testing.T, ids ...uint32) *events.Keyring {
	t.Helper()
	keys := make([]events.ChainKey, len(ids))
	for i, id := range ids {
		keys[i] = events.ChainKey{ID: id, Secret: bytes.Repeat([]byte{byte(id)}, events.MinChainKeyBytes)}
	}
	kr, err := events.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// verifyChain verifies the plant log's stream with chain and returns the
// violations.
func verifyChain(t *testing.T, p *plantLog, chain *replay.Chain) []replay.Violation {
	t.Helper()
	v := replay.NewVerifier(p.ns.Subjects)
	if chain != nil {
		v.Keyed(chain)
	}
	err := logOf(p.js, p.ns).Read(context.Background(), eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return v.Report().Violations
}

// TestVerifyKeyedChain writes a log whose first events predate keying,
// keys it, and checks that replay verify accepts the old unkeyed events
// and the keyed ones, and reports each forgery by someone without the key
// at its sequence: an unkeyed event with the right hash link (on a task
// keyed already, and a downgrade on a task all of whose events predate
// keying), a MAC under another secret, and a key id the file does not
// hold. Rotation: events of the old and the new key verify together.
func TestVerifyKeyedChain(t *testing.T) {
	t.Parallel()
	p := newPlantLog(t)
	legacy := p.queued("acme")  // unkeyed: written before keying began
	oldTask := p.queued("acme") // unkeyed, and never written again by the scheduler
	_, last := streamState(t, p.js, p.ns.Stream)
	keyedFrom := map[int]uint64{0: last + 1}
	key1 := chainKeys(t, 1)
	p.store.UseChain(key1)
	p.exec(legacy.TaskID, aggregate.AppendMail{Message: events.Message{ID: "m1", Content: text("keyed").Content}})
	keyed := p.queued("beta")
	// Rotation: key 2 signs from now on; the file holds both.
	both := chainKeys(t, 1, 2)
	p.store.UseChain(both)
	keyed, evs := p.exec(keyed.TaskID, aggregate.AppendMail{Message: events.Message{ID: "m2", Content: text("rotated").Content}})
	if evs[0].Key != 2 {
		t.Fatalf("the appended event reports key %d, want the newest, 2", evs[0].Key)
	}
	rotated := p.queued("beta")

	if got := verifyChain(t, p, replay.NewChain(both, keyedFrom)); len(got) != 0 {
		t.Fatalf("a keyed log with its old unkeyed events and two keys: %v", got)
	}
	if got := verifyChain(t, p, replay.NewChain(key1, keyedFrom)); len(got) != 1 || got[0].Kind != replay.UnknownKey {
		t.Fatalf("verified without the newer key: %v, want one unknown_key", got)
	}
	if got := verifyChain(t, p, nil); len(got) != 1 || got[0].Kind != replay.UnknownKey || !strings.Contains(got[0].Detail, "--chain-key-file") {
		t.Fatalf("verified without a key: %v, want one unknown_key naming --chain-key-file", got)
	}

	// The forgeries, each with the right number and unkeyed hash link.
	cancel := events.Canceled{Reason: "forged"}
	forgedSeq := p.plant(p.subject(keyed), p.encode(keyed, keyed.Version+1, cancel))
	downgradeSeq := p.plant(p.subject(oldTask), p.encode(oldTask, oldTask.Version+1, cancel))
	other, err := events.NewKeyring( // key id 2, another secret
		events.ChainKey{ID: 2, Secret: bytes.Repeat([]byte{7}, events.MinChainKeyBytes)})
	if err != nil {
		t.Fatal(err)
	}
	signed := func(kr *events.Keyring, st aggregate.State) []byte {
		b, err := kr.AppendEncode(nil, events.Event{ID: events.NewID(), TaskID: st.TaskID, CustomerID: st.CustomerID,
			Number: st.Version + 1, At: p.advance(time.Millisecond), Actor: "planter", Prev: st.LastHash, Data: cancel})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	badMACSeq := p.plant(p.subject(rotated), signed(other, rotated))
	gamma := p.queued("gamma") // keyed (key 2), then forged with a made-up key id
	unknownSeq := p.plant(p.subject(gamma), signed(chainKeys(t, 9), gamma))

	got := verifyChain(t, p, replay.NewChain(both, keyedFrom))
	want := []struct {
		seq  uint64
		kind string
	}{{forgedSeq, replay.Unkeyed}, {downgradeSeq, replay.Unkeyed}, {badMACSeq, replay.BadMAC}, {unknownSeq, replay.UnknownKey}}
	var kinds []string
	for _, v := range got {
		kinds = append(kinds, v.Kind)
	}
	if len(got) != len(want) {
		t.Fatalf("violations %v, want %v", got, want)
	}
	for i, w := range want {
		if uint64(got[i].Seq) != w.seq || got[i].Kind != w.kind {
			t.Fatalf("violation %d: %+v, want %s at %d (all: %v)", i, got[i], w.kind, w.seq, kinds)
		}
	}
	if slices.Contains(kinds, replay.BrokenLink) {
		t.Fatal("a forged event's correct hash link reported broken")
	}
}

// TestChainAcceptsOldFixtures runs the committed v1 and v2 fixtures (the
// logs written before keying) through the keyed chain's rule: written
// before their stream's keying began they pass; written after it (no
// exception for them) each is unkeyed.
func TestChainAcceptsOldFixtures(t *testing.T) {
	t.Parallel()
	keys := chainKeys(t, 1)
	for _, path := range []string{"../events/testdata/v1-log.msgpack", "../events/testdata/v2-log.msgpack"} {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var msgs [][]byte
		for len(raw) >= 4 {
			n := binary.BigEndian.Uint32(raw)
			msgs, raw = append(msgs, raw[4:4+n]), raw[4+n:]
		}
		if len(msgs) == 0 || len(raw) != 0 {
			t.Fatalf("%s: %d events, %d bytes left", path, len(msgs), len(raw))
		}
		before := replay.NewChain(keys, map[int]uint64{0: uint64(len(msgs)) + 1})
		after := replay.NewChain(keys, nil)
		for i, b := range msgs {
			ev, err := events.Decode(b)
			if err != nil {
				t.Fatalf("%s event %d: %v", path, i, err)
			}
			if kind, detail := before.Check(0, uint64(i+1), ev, b); kind != "" {
				t.Fatalf("%s event %d, before keying: %s %s", path, i, kind, detail)
			}
			if kind, _ := after.Check(0, uint64(i+1), ev, b); kind != replay.Unkeyed {
				t.Fatalf("%s event %d, after keying: %q, want unkeyed", path, i, kind)
			}
		}
	}
}
