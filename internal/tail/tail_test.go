package tail

import (
	"bytes"
	"strings"
	"testing"
)

func TestABufferKeepsTheLastBytesAndCountsTheRest(t *testing.T) {
	b := New(8)
	for _, w := range []string{"abc", "defgh", "ij", "klmnopqrstuvwxyz", "0"} {
		if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("write %q: %d %v", w, n, err)
		}
	}
	if got := b.String(); got != "tuvwxyz0" {
		t.Fatalf("kept %q", got)
	}
	if got := b.Dropped(); got != 27-8 {
		t.Fatalf("dropped %d, want %d", got, 27-8)
	}
}

// A gigabyte through a 4 KiB buffer keeps 4 KiB: what the dispatcher reads of a flood.
func TestAGigabyteKeepsOnlyTheTail(t *testing.T) {
	b := New(4096)
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range 1024 {
		b.Write(chunk)
	}
	b.Write([]byte("the end"))
	if got := b.String(); len(got) != 4096 || !strings.HasSuffix(got, "xthe end") {
		t.Fatalf("kept %d bytes ending %q", len(got), got[len(got)-10:])
	}
	if got, want := b.Dropped(), int64(1<<30+len("the end")-4096); got != want {
		t.Fatalf("dropped %d, want %d", got, want)
	}
	if cap(b.buf) > 2<<20 {
		t.Fatalf("the buffer grew to %d bytes", cap(b.buf))
	}
}

func TestRedactReplacesEverySecret(t *testing.T) {
	got := Redact("token tok-1 key gk_2 tok-1 again", "tok-1", "", "gk_2")
	if got != "token [redacted] key [redacted] [redacted] again" {
		t.Fatalf("%q", got)
	}
}
