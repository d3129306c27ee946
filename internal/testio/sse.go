package testio

import (
	"bufio"
	"io"
	"strings"
)

// SSEMessage is one message of a server-sent event stream; a comment has only Comment.
type SSEMessage struct {
	Event, Data, ID, Comment string
}

// ReadSSE reads server-sent events from body, giving each message (a comment alone is
// one too) to each until it returns false or the body ends. Multi-line data is joined with
// newlines, as a browser joins it.
func ReadSSE(body io.Reader, each func(SSEMessage) bool) {
	r := bufio.NewReader(body)
	var m SSEMessage
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if m != (SSEMessage{}) && !each(m) {
				return
			}
			m = SSEMessage{}
		case strings.HasPrefix(line, ":"):
			m.Comment = strings.TrimSpace(line[1:])
		case strings.HasPrefix(line, "event: "):
			m.Event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			if m.Data != "" {
				m.Data += "\n"
			}
			m.Data += line[len("data: "):]
		case strings.HasPrefix(line, "id: "):
			m.ID = line[len("id: "):]
		}
	}
}
