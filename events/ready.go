package events

import (
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// ContentTypeHeader names the encoding of a ready notification's body:
// ContentTypeMsgpack, or ContentTypeJSON. A notification without it is
// JSON (published before msgpack notifications).
const ContentTypeHeader = "Content-Type"

// The encodings of a ready notification.
const (
	ContentTypeMsgpack = "application/msgpack"
	ContentTypeJSON    = "application/json"
)

// MarshalReady encodes n as contentType: msgpack for ContentTypeMsgpack
// (keyed by the JSON field names), JSON for anything else.
func MarshalReady(n ReadyNotification, contentType string) ([]byte, error) {
	if contentType != ContentTypeMsgpack {
		return json.Marshal(n)
	}
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	return e.marshal(nil, &n)
}

// UnmarshalReady decodes a ready notification's body by the value of its
// ContentTypeHeader: msgpack for ContentTypeMsgpack, JSON otherwise. It
// never panics; any error means the body is malformed.
func UnmarshalReady(data []byte, contentType string) (ReadyNotification, error) {
	var n ReadyNotification
	var err error
	if contentType == ContentTypeMsgpack {
		err = unmarshal(data, func(dec *msgpack.Decoder) error { return dec.Decode(&n) })
	} else {
		err = json.Unmarshal(data, &n)
	}
	if err != nil {
		return ReadyNotification{}, fmt.Errorf("%w: ready notification: %v", ErrMalformed, err)
	}
	return n, nil
}
