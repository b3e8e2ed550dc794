package events

import (
	"errors"
	"reflect"
	"testing"
)

// sameReady compares notifications; no labels and empty labels are the
// same (an empty map is left out of both encodings).
func sameReady(a, b ReadyNotification) bool {
	for _, n := range []*ReadyNotification{&a, &b} {
		if len(n.Labels) == 0 {
			n.Labels = nil
		}
	}
	return reflect.DeepEqual(a, b)
}

// TestReadyNotificationEncodings: both encodings carry every field, a body
// without the header is JSON, and malformed bodies are ErrMalformed.
func TestReadyNotificationEncodings(t *testing.T) {
	t.Parallel()
	n := ReadyNotification{TaskID: "t1", CustomerID: "c1", RootID: "r1", ParentID: "p1", Queue: "q", DeliveryID: "d1",
		Signal: Signal{ID: "s", URI: "https://example.com/s", EventType: "push"}, Labels: map[string]string{"repo": "x", "team": ""}, Kind: "resize"}
	for _, ct := range []string{ContentTypeMsgpack, ContentTypeJSON, ""} {
		b, err := MarshalReady(n, ct)
		if err != nil {
			t.Fatalf("%q: %v", ct, err)
		}
		got, err := UnmarshalReady(b, ct)
		if err != nil || !sameReady(got, n) {
			t.Fatalf("%q: decoded %+v, %v; want %+v", ct, got, err, n)
		}
	}
	msgpackBody, _ := MarshalReady(n, ContentTypeMsgpack)
	jsonBody, _ := MarshalReady(n, ContentTypeJSON)
	if len(msgpackBody) >= len(jsonBody) {
		t.Errorf("msgpack body %d bytes, JSON %d: want it smaller", len(msgpackBody), len(jsonBody))
	}
	for _, c := range []struct {
		name, ct string
		body     []byte
	}{
		{"MsgpackAsJSON", "", msgpackBody},
		{"JSONAsMsgpack", ContentTypeMsgpack, jsonBody},
		{"Trailing", ContentTypeMsgpack, append(msgpackBody, 0)},
		{"Empty", ContentTypeMsgpack, nil},
		{"Garbage", ContentTypeMsgpack, []byte{0xc1, 0xff}},
	} {
		if _, err := UnmarshalReady(c.body, c.ct); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", c.name, err)
		}
	}
}

// FuzzUnmarshalReady: a notification body of either encoding never
// panics the decoder, and whatever decodes re-encodes to the same value.
func FuzzUnmarshalReady(f *testing.F) {
	n := ReadyNotification{TaskID: "t1", CustomerID: "c1", RootID: "r1", Queue: "q", DeliveryID: "d1", Signal: Signal{ID: "s"},
		Labels: map[string]string{"repo": "x"}}
	for _, ct := range []string{ContentTypeMsgpack, ContentTypeJSON} {
		b, err := MarshalReady(n, ct)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, ct == ContentTypeMsgpack)
		f.Add(b[:len(b)/2], ct == ContentTypeMsgpack)
	}
	f.Add([]byte{0x81, 0xa6, 's', 'i', 'g', 'n', 'a', 'l', 0xc0}, true)
	f.Fuzz(func(t *testing.T, b []byte, asMsgpack bool) {
		ct := ContentTypeJSON
		if asMsgpack {
			ct = ContentTypeMsgpack
		}
		got, err := UnmarshalReady(b, ct)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		again, err := MarshalReady(got, ct)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", got, err)
		}
		if back, err := UnmarshalReady(again, ct); err != nil || !sameReady(back, got) {
			t.Fatalf("round trip %+v -> %+v (%v)", got, back, err)
		}
	})
}
