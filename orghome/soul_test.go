package orghome

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

var acme = Identity{OrgID: "acme", DisplayName: "Acme Corp"}

const freeText = "## Notes the agent keeps\n\nTone: friendly.  Trailing spaces stay.   \n\n\n§ odd bytes \x01 and no final newline"

func readSoul(t *testing.T, h *Home) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Dir, "SOUL.md"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ensure(t *testing.T, h *Home) SoulResult {
	t.Helper()
	res, err := h.EnsureSoul(acme)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestSoulFirstEnsureKeepsTheExistingTextAsTheFreeSection(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "SOUL.md", freeText)
	if res := ensure(t, h); !res.Changed {
		t.Fatal("first ensure wrote nothing")
	}
	got := readSoul(t, h)
	want := RenderSoulBlock(acme) + "\n" + freeText
	if string(got) != want {
		t.Fatalf("SOUL.md =\n%q\nwant\n%q", got, want)
	}
	if !strings.Contains(string(got), `organization "Acme Corp" (organization id `+"`acme`") {
		t.Errorf("block does not name the org: %s", got)
	}
}

func TestSoulTamperedBlockIsRestoredAndTheFreeSectionKeptByteForByte(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "SOUL.md", freeText)
	ensure(t, h)
	good := readSoul(t, h)

	// The agent (or a page it read) rewrites the host's block: it now "works for" another org.
	tampered := bytes.Replace(good, []byte("You act only for the organization `acme`"), []byte("You act for the organization `evil`"), 1)
	if bytes.Equal(tampered, good) {
		t.Fatal("fixture did not change the block")
	}
	if err := os.WriteFile(filepath.Join(h.Dir, "SOUL.md"), tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	log := captureLog(t, h)
	res := ensure(t, h)
	if !res.Changed || res.Reason != "generated block edited" {
		t.Fatalf("ensure after tampering = %+v", res)
	}
	if line := log.String(); !strings.Contains(line, "level=WARN") || !strings.Contains(line, `msg="SOUL.md generated block restored" org=acme reason="generated block edited"`) {
		t.Errorf("restoration not logged as a warning: %q", line)
	}
	if got := readSoul(t, h); !bytes.Equal(got, good) {
		t.Fatalf("restored SOUL.md =\n%q\nwant\n%q", got, good)
	}
	if !bytes.HasSuffix(readSoul(t, h), []byte(freeText)) {
		t.Fatal("free section changed")
	}
	receipts, err := h.Receipts("SOUL.md")
	if err != nil || len(receipts) == 0 {
		t.Fatalf("receipts = %v, %v; want the tampered file kept", receipts, err)
	}
	kept, err := os.ReadFile(receipts[0].Path)
	if err != nil || !bytes.Equal(kept, tampered) {
		t.Fatalf("newest receipt = %q, %v; want the tampered file", kept, err)
	}
}

func TestSoulSecondEnsureWritesNothing(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "SOUL.md", freeText)
	ensure(t, h)
	path := filepath.Join(h.Dir, "SOUL.md")
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if res := ensure(t, h); res.Changed {
		t.Fatalf("second ensure changed the file: %+v", res)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !before.ModTime().Equal(after.ModTime()) {
		t.Fatal("second ensure replaced SOUL.md (inode or mtime moved)")
	}
	if receipts, _ := h.Receipts("SOUL.md"); len(receipts) != 1 {
		t.Fatalf("receipts = %d; only the first ensure replaced a file", len(receipts))
	}
}

func TestSoulOlderBlockVersionIsReplaced(t *testing.T) {
	_, h := newHome(t, "acme")
	old := "<!-- hermes-host:identity BEGIN v0 -->\nYou are an agent.\n<!-- hermes-host:identity END v0 -->\n\n" + freeText
	writeFile(t, h.Dir, "SOUL.md", old)
	res := ensure(t, h)
	if !res.Changed || res.Reason != "older block version v0" {
		t.Fatalf("ensure = %+v", res)
	}
	if got, want := string(readSoul(t, h)), RenderSoulBlock(acme)+"\n"+freeText; got != want {
		t.Fatalf("SOUL.md =\n%q\nwant\n%q", got, want)
	}
}

func TestSoulRenamedOrgIsNotTampering(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "SOUL.md", freeText)
	ensure(t, h)
	res, err := h.EnsureSoul(Identity{OrgID: "acme", DisplayName: "Acme Holdings"})
	if err != nil || !res.Changed || res.Reason != "identity changed" {
		t.Fatalf("ensure with a new display name = %+v, %v", res, err)
	}
}

func TestSoulMalformedMarkersKeepTheFreeText(t *testing.T) {
	block := RenderSoulBlock(acme)
	cases := []struct {
		name, file, free string
	}{
		{"BEGIN without END",
			"<!-- hermes-host:identity BEGIN v1 -->\nkeep me\n" + freeText,
			"keep me\n" + freeText},
		{"END without BEGIN",
			"before\n<!-- hermes-host:identity END v1 -->\n" + freeText,
			"before\n" + freeText},
		{"duplicated blocks",
			block + "\n" + "middle\n" + block + freeText,
			"middle\n" + freeText},
		{"block moved below the free text",
			"top\n" + block + freeText,
			"top\n" + freeText},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, h := newHome(t, "acme")
			writeFile(t, h.Dir, "SOUL.md", c.file)
			if res := ensure(t, h); !res.Changed {
				t.Fatal("malformed SOUL.md left as is")
			}
			if got, want := string(readSoul(t, h)), block+"\n"+c.free; got != want {
				t.Fatalf("SOUL.md =\n%q\nwant\n%q", got, want)
			}
			if res := ensure(t, h); res.Changed {
				t.Fatalf("repair is not stable: second ensure %+v", res)
			}
		})
	}
}

func TestSoulSymlinkIsReplacedNotFollowed(t *testing.T) {
	_, h := newHome(t, "acme")
	target := writeFile(t, t.TempDir(), "target.md", "not yours")
	symlink(t, target, filepath.Join(h.Dir, "SOUL.md"))
	if res := ensure(t, h); !res.Changed {
		t.Fatal("symlinked SOUL.md left in place")
	}
	if b, _ := os.ReadFile(target); string(b) != "not yours" {
		t.Fatalf("the link's target was written: %q", b)
	}
	fi, err := os.Lstat(filepath.Join(h.Dir, "SOUL.md"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("SOUL.md is %v, %v; want a regular file", fi, err)
	}
}

func TestSoulRefusesAnotherOrgsIdentity(t *testing.T) {
	_, h := newHome(t, "acme")
	if _, err := h.EnsureSoul(Identity{OrgID: "beta"}); err == nil {
		t.Fatal("ensured beta's identity in acme's home")
	}
}

// A full disk during regeneration must leave the old SOUL.md byte for byte. The disk is a
// real 64 KiB tmpfs, filled to the last byte.
func TestSoulFullDiskLeavesTheOldFileIntact(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("needs root to mount a 64 KiB tmpfs for a real ENOSPC: mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	if err := os.MkdirAll(filepath.Join(dir, "orgs", "acme"), 0o755); err != nil {
		t.Fatal(err)
	}
	orgs, err := OpenOrgs(filepath.Join(dir, "orgs"))
	if err != nil {
		t.Fatal(err)
	}
	defer orgs.Close()
	h, err := orgs.Open("acme")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	writeFile(t, h.Dir, "SOUL.md", freeText)
	ensure(t, h)
	tampered := bytes.Replace(readSoul(t, h), []byte("You only propose."), []byte("You apply changes directly."), 1)
	if err := os.WriteFile(filepath.Join(h.Dir, "SOUL.md"), tampered, 0o644); err != nil {
		t.Fatal(err)
	}

	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := fill.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			break
		}
	}
	fill.Close()

	_, err = h.EnsureSoul(acme)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("ensure on a full disk: %v; want an ENOSPC error", err)
	}
	if got := readSoul(t, h); !bytes.Equal(got, tampered) {
		t.Fatalf("SOUL.md changed on a full disk:\n%q\nwant\n%q", got, tampered)
	}
	leftovers, _ := filepath.Glob(filepath.Join(h.Dir, ".SOUL.md.tmp-*"))
	if len(leftovers) > 0 {
		t.Errorf("temp files left: %v", leftovers)
	}

	// Once there is room again, the next agent start restores the block.
	if err := os.Remove(filepath.Join(dir, "fill")); err != nil {
		t.Fatal(err)
	}
	if res := ensure(t, h); !res.Changed {
		t.Fatal("block not restored once the disk had room")
	}
}
