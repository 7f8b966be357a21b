package admin

import (
	"errors"
	"io"

	"github.com/delaybridge/delaybridge/pkg/strictjson"
)

// unmarshalJSON is how the API reads a JSON body (the Unmarshal of its
// huma format): strictjson.Decode, the reason as the error.
func unmarshalJSON(data []byte, v any) error {
	if _, reason := strictjson.Decode(data, v); reason != "" {
		return errors.New(reason)
	}
	return nil
}

// marshalJSON is how the API writes JSON (the Marshal of its huma format).
func marshalJSON(w io.Writer, v any) error { return EncodeJSON(w, v, "") }
