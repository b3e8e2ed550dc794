package archive

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// Errors, returned wrapped with the part and sequence concerned.
var (
	// ErrNotSealed: Write or CheckLive found a stream of the epoch that
	// is not sealed, so it could still change.
	ErrNotSealed = errors.New("archive: the stream is not sealed")
	// ErrNotEmpty: Write's directory exists and holds something.
	ErrNotEmpty = errors.New("archive: the directory exists and is not empty")
	// ErrIncomplete: Write read another log than the stream's state
	// describes (a hole, fewer messages), or a message it cannot archive.
	ErrIncomplete = errors.New("archive: the stream cannot be archived whole")
	// ErrDamaged: a part file or the manifest is not what the manifest
	// describes (Open, Verify and every reader).
	ErrDamaged = errors.New("archive: the archive is damaged")
	// ErrLiveMismatch: CheckLive found a live stream other than the one
	// the manifest describes.
	ErrLiveMismatch = errors.New("archive: the live log differs from the archive")
)

// Format is the version of the archive layout this package writes and reads.
const Format = 1

// ManifestFile is the manifest's name inside an archive directory.
const ManifestFile = "manifest.json"

const magic = "TLARCV1\n"

// MaxData is the largest stored message an archive holds: 8 MiB, the
// size above which nats-server warns that max_payload is too large
// (MAX_PAYLOAD_MAX_SIZE; taskledger's events stay far below, their fields
// being bounded by events' limits). Readers refuse a record longer than
// maxRecord before allocating it, so a corrupt or hostile length cannot
// make them allocate gigabytes.
const MaxData = 8 << 20

// recordHeader is the fixed part of a record after its length: seq,
// time and the subject's length.
const recordHeader = 8 + 8 + 2

// maxRecord is the longest record a reader accepts: the header, the
// longest subject a u16 counts and MaxData.
const maxRecord = recordHeader + 1<<16 - 1 + MaxData

// Epoch names a set of parts of the log to archive.
type Epoch struct {
	Name  string
	Parts []int // part (shard) indices, as eventlog.ReadOptions.Shards takes them
	// From and To, if set, are the times the epoch covers, recorded in
	// the manifest.
	From, To time.Time
}

// Manifest describes an archive.
type Manifest struct {
	Format   int    `json:"format"`
	Stream   string `json:"stream"`   // the log's stream base name
	Subjects string `json:"subjects"` // the log's subjects root
	Shards   int    `json:"shards"`   // the log's number of shards (K)
	// EpochSlots is the log's number of epoch slots (events.Shards.Slots);
	// 0 for a log without epochs.
	EpochSlots int       `json:"epochSlots,omitempty"`
	Epoch      string    `json:"epoch"`
	From       time.Time `json:"from,omitzero"`
	To         time.Time `json:"to,omitzero"`
	Created    time.Time `json:"created"`
	Parts      []Part    `json:"parts"`
}

// Layout returns the log's layout the manifest records: its positions and
// routing.
func (m Manifest) Layout() events.Shards { return events.Shards{K: m.Shards, Slots: m.EpochSlots} }

// Events returns the number of events the archive holds.
func (m Manifest) Events() uint64 {
	var n uint64
	for _, p := range m.Parts {
		n += p.Count
	}
	return n
}

// Part describes one part file.
type Part struct {
	Part     int    `json:"part"`
	Stream   string `json:"stream"`
	File     string `json:"file"`
	FirstSeq uint64 `json:"firstSeq"` // 0 for an empty part
	LastSeq  uint64 `json:"lastSeq"`
	Count    uint64 `json:"count"`
	Bytes    int64  `json:"bytes"`  // the file's size
	Chain    Sum    `json:"chain"`  // the records' final chain value
	SHA256   Sum    `json:"sha256"` // of the whole file
	// Head is the live log's chain head at the part's last event (its
	// position and the SHA-256 of its stored bytes); nil for an empty part.
	Head *eventlog.Head `json:"head,omitempty"`
}

// Sum is a SHA-256, hex in JSON.
type Sum [sha256.Size]byte

// MarshalText implements encoding.TextMarshaler.
func (s Sum) MarshalText() ([]byte, error) { return hex.AppendEncode(nil, s[:]), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Sum) UnmarshalText(b []byte) error {
	if len(b) != hex.EncodedLen(len(s)) {
		return fmt.Errorf("archive: bad sha256 %q", b)
	}
	if _, err := hex.Decode(s[:], b); err != nil {
		return fmt.Errorf("archive: bad sha256 %q", b)
	}
	return nil
}

// String returns the hex form.
func (s Sum) String() string { return hex.EncodeToString(s[:]) }

// chainNext is the chain value after a record whose bytes (from n on)
// are the concatenation of rec.
func chainNext(chain Sum, rec ...[]byte) Sum {
	h := sha256.New()
	h.Write(chain[:])
	for _, b := range rec {
		h.Write(b)
	}
	return Sum(h.Sum(nil))
}

func fileName(part int) string { return fmt.Sprintf("part-%d.tlar", part) }

// Heads returns the live log's chain head at the last event of each
// non-empty part.
func (m Manifest) Heads() []eventlog.Head {
	var hs []eventlog.Head
	for _, p := range m.Parts {
		if p.Head != nil {
			hs = append(hs, *p.Head)
		}
	}
	return hs
}
