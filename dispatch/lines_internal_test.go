package dispatch

import (
	"strings"
	"testing"
)

// eachLine hands on the lines within the bound, skips (and counts) longer ones without
// keeping them, and reads its input to the end, a last line without a newline included.
func TestEachLineSkipsLinesPastTheBound(t *testing.T) {
	in := "short\n" + strings.Repeat("x", 200_000) + "\n" + "exactly10!\n" + strings.Repeat("y", 11) + "\nlast"
	var got []string
	long := 0
	eachLine(strings.NewReader(in), 100_000, func() { long++ }, func(l []byte) { got = append(got, string(l)) })
	if long != 1 || strings.Join(got, ",") != "short,exactly10!,"+strings.Repeat("y", 11)+",last" {
		t.Fatalf("lines %q, %d too long", got, long)
	}
	got, long = nil, 0
	eachLine(strings.NewReader("0123456789\n01234567890\n"), 10, func() { long++ }, func(l []byte) { got = append(got, string(l)) })
	if long != 1 || len(got) != 1 || got[0] != "0123456789" {
		t.Fatalf("at the bound: %q, %d too long", got, long)
	}
}
