package events

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Decoding errors. Decode wraps one of them with detail; test with errors.Is.
var (
	// ErrMalformed is returned by Decode for bytes that are not a
	// well-formed event envelope or payload.
	ErrMalformed = errors.New("events: malformed event")
	// ErrUnknownType is returned by Decode for an event type this build
	// does not know.
	ErrUnknownType = errors.New("events: unknown event type")
	// ErrUnknownVersion is returned by Decode for a schema version newer
	// than this build knows, or zero.
	ErrUnknownVersion = errors.New("events: unknown schema version")
)

// currentVersion is the schema version Encode writes for every type that
// has no newer one in payloadVersions. When a payload changes shape, bump
// the version of that type only (payloadVersions) and teach upcast to
// turn the older bytes into the new struct.
//
// Version 2 changed the envelope, not a payload: it adds "prev", the
// SHA-256 of the task's previous event. Every payload reads the same at
// versions 1 and 2, so both decode with the current structs; a v1 event
// has no prev and starts a hash chain.
const currentVersion = 2

// payloadVersions are the types whose payload changed after version 2,
// with the version Encode writes for them. An older build refuses them as
// ErrUnknownVersion instead of silently dropping the new fields.
//
// TaskScheduled v3 adds the optional deliveryId and nextAt: a task due
// when it was scheduled is released in the same event. Its v1 and v2
// bytes have neither and decode as a task not yet released.
var payloadVersions = map[Type]wireVersion{TypeTaskScheduled: 3}

// versionOf is the schema version Encode writes for type t, and the
// newest Decode reads.
func versionOf(t Type) wireVersion {
	if v, ok := payloadVersions[t]; ok {
		return v
	}
	return currentVersion
}

// wire is the stored shape of an event. Field names are short and fixed:
// they are part of the log format.
type wire struct {
	ID         string      `msgpack:"id"`
	Type       Type        `msgpack:"t"`
	Version    wireVersion `msgpack:"v"`
	TaskID     string      `msgpack:"task"`
	CustomerID string      `msgpack:"cust"`
	Number     int64       `msgpack:"n"`
	At         time.Time   `msgpack:"at"`
	Actor      string      `msgpack:"actor,omitempty"`
	Prev       []byte      `msgpack:"prev,omitempty"` // since v2; absent on a task's first event
	Key        uint32      `msgpack:"kid,omitempty"`  // keyed events: the chain key id; absent unkeyed
	Data       payload     `msgpack:"data"`
	// MAC, on a keyed event, is the HMAC-SHA256 under key Key of every
	// stored byte before it: it must stay the last field, so that it is
	// the last MACSize bytes of the event (Keyring.Verify needs no
	// re-encoding).
	MAC []byte `msgpack:"mac,omitempty"`
}

// payload is the data of an event, written in place. Encode writes the
// type and version before it, so Decode usually decodes it in one pass
// into its struct; when it cannot yet (another key order, an older
// version, an unknown type), it keeps the bytes for upcast.
type payload struct {
	w   *wire // the envelope being decoded
	p   Payload
	raw msgpack.RawMessage
}

func (d payload) EncodeMsgpack(enc *msgpack.Encoder) error {
	if d.p == nil {
		return enc.Encode(d.raw) // written verbatim; nil when empty
	}
	return enc.Encode(d.p)
}

func (d *payload) DecodeMsgpack(dec *msgpack.Decoder) error {
	if d.w != nil && d.w.Version >= 1 && d.w.Version <= versionOf(d.w.Type) {
		if decode := decoders[d.w.Type]; decode != nil {
			p, err := decode(dec)
			if err != nil {
				return fmt.Errorf("%s payload: %w", d.w.Type, err)
			}
			d.p = p
			return nil
		}
	}
	raw, err := dec.DecodeRaw()
	d.p, d.raw = nil, raw
	return err
}

// wireVersion is the stored schema version. It encodes as a plain uint8
// but decodes from any msgpack integer without wrapping: a version outside
// 0..255 saturates to 0 or 255, so it is rejected as unknown instead of
// being truncated onto a known version (257 would otherwise read as 1).
type wireVersion uint8

func (v *wireVersion) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeInt64()
	if err != nil {
		return err
	}
	*v = wireVersion(min(max(n, 0), 255))
	return nil
}

var encoders = sync.Pool{New: func() any {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetCustomStructTag("json")
	enc.SetSortMapKeys(true) // a spec's labels encode the same way every time
	return &encoder{buf: &buf, enc: enc}
}}

// encoder is a reusable encoding of one event: its buffer, and the
// envelope and prev hash it encodes from, so an Encode allocates only the
// bytes it returns.
type encoder struct {
	buf  *bytes.Buffer
	enc  *msgpack.Encoder
	w    wire
	prev Hash
	mac  [MACSize]byte // the MAC's place, zero until signed
}

// marshal appends the encoding of v to dst.
func (e *encoder) marshal(dst []byte, v any) ([]byte, error) {
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	return append(dst, e.buf.Bytes()...), nil
}

// Encode returns the msgpack encoding of ev. It fails only when ev has no
// payload or an invalid task or customer id. It is safe for concurrent
// use.
func Encode(ev Event) ([]byte, error) { return AppendEncode(nil, ev) }

// AppendEncode appends the encoding of ev to dst and returns the extended
// buffer, for a caller that reuses its buffers; errors are Encode's.
func AppendEncode(dst []byte, ev Event) ([]byte, error) { return appendEncode(dst, ev, nil) }

// appendEncode is AppendEncode, keyed under key when key is not nil.
func appendEncode(dst []byte, ev Event, key *macKey) ([]byte, error) {
	if ev.Data == nil {
		return nil, fmt.Errorf("events: encode %s: no payload", ev.ID)
	}
	if err := ValidID(ev.TaskID); err != nil {
		return nil, fmt.Errorf("events: encode task id: %w", err)
	}
	if err := ValidID(ev.CustomerID); err != nil {
		return nil, fmt.Errorf("events: encode customer id: %w", err)
	}
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	e.w = wire{
		ID:         ev.ID,
		Type:       ev.Type(),
		Version:    versionOf(ev.Type()),
		TaskID:     ev.TaskID,
		CustomerID: ev.CustomerID,
		Number:     int64(ev.Number),
		At:         ev.At.UTC(),
		Actor:      ev.Actor,
		Data:       payload{p: ev.Data},
	}
	if !ev.Prev.IsZero() {
		e.prev = ev.Prev // a copy: ev.Prev[:] would move all of ev to the heap
		e.w.Prev = e.prev[:]
	}
	if key != nil {
		e.mac = [MACSize]byte{}
		e.w.Key, e.w.MAC = key.id, e.mac[:]
	}
	start := len(dst)
	b, err := e.marshal(dst, e.w)
	e.w = wire{} // hold no payload in the pool
	if err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", ev.Type(), err)
	}
	if key != nil {
		// The MAC is the last field: sign what is before it, in place.
		end := len(b) - MACSize
		key.sign(b[start:end], b[end:])
	}
	return b, nil
}

// DecodeAt decodes the event stored at log position seq and sets its
// Seq; errors are Decode's.
func DecodeAt(b []byte, seq Position) (Event, error) {
	ev, err := Decode(b)
	ev.Seq = seq
	return ev, err
}

// DecodeHashed is DecodeAt that also sets the event's Hash from b: for a
// reader that continues the task's chain or checks it.
func DecodeHashed(b []byte, seq Position) (Event, error) {
	ev, err := DecodeAt(b, seq)
	ev.Hash = HashOf(b)
	return ev, err
}

// Decode parses an encoded event. It returns an error wrapping
// ErrMalformed, ErrUnknownType or ErrUnknownVersion and never panics.
// Older schema versions are upcast to the current payload structs. It is
// safe for concurrent use; the event shares no memory with b.
func Decode(b []byte) (Event, error) {
	d := envelopes.Get().(*envelope)
	defer envelopes.Put(d)
	// The envelope is reused: its prev and mac buffers take the hash and
	// the MAC in place.
	d.w = wire{Prev: d.prev[:0], MAC: d.mac[:0]}
	d.w.Data.w = &d.w
	err := unmarshal(b, func(dec *msgpack.Decoder) error { return dec.Decode(&d.w) })
	w := d.w
	d.w = wire{} // hold no payload in the pool
	if err != nil {
		return Event{}, fmt.Errorf("%w: envelope: %v", ErrMalformed, err)
	}
	if err := ValidID(w.TaskID); err != nil {
		return Event{}, fmt.Errorf("%w: task id: %v", ErrMalformed, err)
	}
	if err := ValidID(w.CustomerID); err != nil {
		return Event{}, fmt.Errorf("%w: customer id: %v", ErrMalformed, err)
	}
	data := w.Data.p
	if data == nil {
		var err error
		if data, err = upcast(w.Type, uint8(w.Version), w.Data.raw); err != nil {
			return Event{}, fmt.Errorf("event %s of task %s: %w", w.ID, w.TaskID, err)
		}
	}
	if w.Number < 1 || w.Number > 1<<31 {
		return Event{}, fmt.Errorf("%w: event number %d", ErrMalformed, w.Number)
	}
	var prev Hash
	if len(w.Prev) != 0 && len(w.Prev) != len(prev) {
		return Event{}, fmt.Errorf("%w: prev hash of %d bytes", ErrMalformed, len(w.Prev))
	}
	copy(prev[:], w.Prev)
	// A keyed event ends with its MAC (Keyring.Verify reads it there); an
	// unkeyed one has none.
	switch {
	case w.Key == 0 && len(w.MAC) != 0:
		return Event{}, fmt.Errorf("%w: a MAC without a chain key id", ErrMalformed)
	case w.Key != 0 && (len(w.MAC) != MACSize || !bytes.Equal(w.MAC, b[len(b)-MACSize:])):
		return Event{}, fmt.Errorf("%w: chain key %d without a %d-byte MAC at the end", ErrMalformed, w.Key, MACSize)
	}
	return Event{
		ID:         w.ID,
		Version:    uint8(w.Version),
		TaskID:     w.TaskID,
		CustomerID: w.CustomerID,
		Number:     int(w.Number),
		At:         w.At,
		Actor:      w.Actor,
		Prev:       prev,
		Key:        w.Key,
		Data:       data,
	}, nil
}

// envelope is a reusable envelope to decode into, with room for its prev
// hash and its MAC, so a Decode allocates only what the event keeps.
type envelope struct {
	w    wire
	prev Hash
	mac  [MACSize]byte
}

var envelopes = sync.Pool{New: func() any { return new(envelope) }}

// upcast decodes the payload bytes of an event of type t written with
// schema version v into the current payload struct. It is the one place
// that knows about old versions. Today every older payload reads as the
// current struct: versions 1 and 2 of every type are the same, and a
// TaskScheduled before v3 lacks only the optional release fields, which
// decode as absent (not released).
func upcast(t Type, v uint8, data []byte) (Payload, error) {
	if v == 0 || wireVersion(v) > versionOf(t) {
		return nil, fmt.Errorf("%w: %s v%d", ErrUnknownVersion, t, v)
	}
	decode := decoders[t]
	if decode == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownType, t)
	}
	var p Payload
	if err := unmarshal(data, func(dec *msgpack.Decoder) (err error) { p, err = decode(dec); return err }); err != nil {
		return nil, fmt.Errorf("%w: %s payload: %v", ErrMalformed, t, err)
	}
	return p, nil
}

// decoders decode the current version of each payload type.
var decoders = map[Type]func(*msgpack.Decoder) (Payload, error){
	TypeTaskScheduled:          decodeAs[TaskScheduled],
	TypeAdmissionRejected:      decodeAs[AdmissionRejected],
	TypeDeliveryPending:        decodeAs[DeliveryPending],
	TypeDeliveryRetryScheduled: decodeAs[DeliveryRetryScheduled],
	TypeDeliveryExhausted:      decodeAs[DeliveryExhausted],
	TypeReadyPublished:         decodeAs[ReadyPublished],
	TypeReadyRepublished:       decodeAs[ReadyRepublished],
	TypeClaimed:                decodeAs[Claimed],
	TypeTimedOut:               decodeAs[TimedOut],
	TypeResultRecorded:         decodeAs[ResultRecorded],
	TypeCanceled:               decodeAs[Canceled],
	TypeMailboxAppended:        decodeAs[MailboxAppended],
	TypeMailboxRead:            decodeAs[MailboxRead],
	TypeEffectsReported:        decodeAs[EffectsReported],
	TypeCheckFailed:            decodeAs[CheckFailed],
	TypeRunSaved:               decodeAs[RunSaved],
	TypeSlotAcquired:           decodeAs[SlotAcquired],
	TypeSlotReleased:           decodeAs[SlotReleased],
	TypeRetryScheduled:         decodeAs[RetryScheduled],
	TypeClaimLost:              decodeAs[ClaimLost],
	// The schedule events.
	TypeScheduleCreated: decodeAs[ScheduleCreated],
	TypeScheduleUpdated: decodeAs[ScheduleUpdated],
	TypeSchedulePaused:  decodeAs[SchedulePaused],
	TypeScheduleResumed: decodeAs[ScheduleResumed],
	TypeScheduleDeleted: decodeAs[ScheduleDeleted],
	TypeScheduleFired:   decodeAs[ScheduleFired],
}

func decodeAs[P Payload](dec *msgpack.Decoder) (Payload, error) {
	var p P
	err := dec.Decode(&p)
	return p, err
}

// unmarshal decodes one msgpack value that must fill b exactly. msgpack
// v5.4.1 panics on some inputs (a nil where a time.Time is expected calls
// reflect.Value.IsNil on a struct), so a panic is turned into an error:
// Decode must never panic on bytes read from the log.
func unmarshal(b []byte, decode func(*msgpack.Decoder) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("msgpack panic: %v", r)
		}
	}()
	r := bytes.NewReader(b)
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(r)
	dec.SetCustomStructTag("json")
	if err := decode(dec); err != nil {
		return err
	}
	if r.Len() != 0 {
		return fmt.Errorf("%d trailing bytes", r.Len())
	}
	return nil
}

// KnownType reports whether t is an event type this build decodes.
func KnownType(t Type) bool {
	_, ok := decoders[t]
	return ok
}
