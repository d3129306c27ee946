package config

import (
	"fmt"
	"strings"
	"testing"
)

func TestUnitLimitsDefaultToBounded(t *testing.T) {
	env := FromMap(map[string]string{UnitMemoryLimit.Name: " "})
	got := env.UnitLimits()
	if err := env.Err(); err != nil {
		t.Fatal(err)
	}
	if want := (Limits{MemoryBytes: 2 << 30, NanoCPUs: 1e9, Pids: 512}); got != want {
		t.Fatalf("default limits %+v, want %+v", got, want)
	}
	if user := env.UnitUser(); user != "10001:10001" || env.Err() != nil {
		t.Fatalf("default user %q (%v)", user, env.Err())
	}
}

func TestUnitLimitsParse(t *testing.T) {
	for raw, want := range map[string]int64{"512MiB": 512 << 20, "512m": 512 << 20, "2G": 2 << 30, "1.5": 0,
		"1073741824": 1 << 30, "64 MiB": 64 << 20, "1TiB": 1 << 40} {
		env := FromMap(map[string]string{UnitMemoryLimit.Name: raw})
		got := env.UnitLimits().MemoryBytes
		if want == 0 {
			if env.Err() == nil {
				t.Errorf("memory %q accepted as %d", raw, got)
			}
			continue
		}
		if got != want || env.Err() != nil {
			t.Errorf("memory %q = %d (%v), want %d", raw, got, env.Err(), want)
		}
	}
	for raw, want := range map[string]int64{"0.5": 5e8, "2": 2e9, "0.001": 1e6} {
		env := FromMap(map[string]string{UnitCPULimit.Name: raw})
		if got := env.UnitLimits().NanoCPUs; got != want || env.Err() != nil {
			t.Errorf("cpus %q = %d (%v), want %d", raw, got, env.Err(), want)
		}
	}
	env := FromMap(map[string]string{UnitPidsLimit.Name: "64"})
	if got := env.UnitLimits().Pids; got != 64 || env.Err() != nil {
		t.Errorf("pids 64 = %d (%v)", got, env.Err())
	}
}

// No way to unbounded units but none with UNIT_LIMITS_NONE=true: 0, negative, junk and
// none alone are refused, each with one line naming the variable.
func TestUnboundedUnitsOnlyWhenAskedFor(t *testing.T) {
	for _, v := range []Var{UnitMemoryLimit, UnitCPULimit, UnitPidsLimit} {
		for _, raw := range []string{"0", "-1", "none", "NONE", "unlimited", "1e400", "0.0000001"} {
			env := FromMap(map[string]string{v.Name: raw})
			env.UnitLimits()
			err := env.Err()
			if err == nil {
				t.Errorf("%s=%s accepted without %s", v.Name, raw, UnitLimitsNone.Name)
				continue
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config: "+v.Name+": ") || strings.Contains(msg, "\n") || !strings.Contains(msg, UnitLimitsNone.Name) {
				t.Errorf("%s=%s: %q, want one line naming %s and how to allow none", v.Name, raw, msg, v.Name)
			}
		}
		env := FromMap(map[string]string{v.Name: "none", UnitLimitsNone.Name: "true"})
		got := env.UnitLimits()
		if err := env.Err(); err != nil {
			t.Errorf("%s=none with %s=true: %v", v.Name, UnitLimitsNone.Name, err)
		}
		bounded := Limits{MemoryBytes: 2 << 30, NanoCPUs: 1e9, Pids: 512}
		switch v {
		case UnitMemoryLimit:
			bounded.MemoryBytes = 0
		case UnitCPULimit:
			bounded.NanoCPUs = 0
		case UnitPidsLimit:
			bounded.Pids = 0
		}
		if got != bounded {
			t.Errorf("%s=none allowed: %+v, want only it unbounded: %+v", v.Name, got, bounded)
		}
		// 0 stays a mistake even where none is allowed.
		env = FromMap(map[string]string{v.Name: "0", UnitLimitsNone.Name: "true"})
		env.UnitLimits()
		if env.Err() == nil {
			t.Errorf("%s=0 accepted", v.Name)
		}
	}
	env := FromMap(map[string]string{UnitMemoryLimit.Name: "1MiB"})
	env.UnitLimits()
	if env.Err() == nil {
		t.Error("a 1MiB memory limit accepted; Docker refuses under 6MiB")
	}
}

func TestUnitUser(t *testing.T) {
	for raw, ok := range map[string]bool{"10001:10001": true, "0:0": true, "1000:100": true,
		"65534:65534": false, "hermes": false, "1000": false, "-1:5": false, "5:-1": false, "a:b": false} {
		env := FromMap(map[string]string{UnitUser.Name: raw})
		got := env.UnitUser()
		if ok != (env.Err() == nil) || ok && got != raw {
			t.Errorf("UNIT_USER=%s: %q, %v", raw, got, env.Err())
		}
		if !ok && !strings.HasPrefix(env.Err().Error(), "config: UNIT_USER: ") {
			t.Errorf("UNIT_USER=%s: %v", raw, env.Err())
		}
	}
}

func TestUnitUIDs(t *testing.T) {
	if first, last, ok := FromMap(nil).UnitUIDs(); !ok || first != 200000 || last != 299999 {
		t.Fatalf("default UNIT_UIDS: %d-%d, %v; want each org its own of 200000-299999", first, last, ok)
	}
	for raw, want := range map[string]string{"shared": "shared", "1000-1999": "1000-1999", "70000-70000": "70000-70000",
		"60000-70000": "", "0-10": "", "10-9": "", "10001": "", "a-b": "", "-5-10": "", "1-2147483647": ""} {
		env := FromMap(map[string]string{UnitUIDs.Name: raw})
		first, last, ok := env.UnitUIDs()
		got := "shared"
		if ok {
			got = fmt.Sprintf("%d-%d", first, last)
		}
		if want == "" {
			if env.Err() == nil || !strings.HasPrefix(env.Err().Error(), "config: UNIT_UIDS: ") {
				t.Errorf("UNIT_UIDS=%s accepted as %s (%v)", raw, got, env.Err())
			}
			continue
		}
		if got != want || env.Err() != nil {
			t.Errorf("UNIT_UIDS=%s: %s (%v), want %s", raw, got, env.Err(), want)
		}
	}
}

func TestUnitEgressAllow(t *testing.T) {
	env := FromMap(map[string]string{UnitEgressAllow.Name: " 10.20.0.0/16, 192.0.2.7 ,2001:db8::1,10.1.2.3/8"})
	if got := fmt.Sprint(env.UnitEgressAllow()); got != "[10.20.0.0/16 192.0.2.7/32 2001:db8::1/128 10.0.0.0/8]" || env.Err() != nil {
		t.Fatalf("allow list %s (%v)", got, env.Err())
	}
	for _, bad := range []string{"example.com", "10.0.0.0/33", "fe80::1%eth0"} {
		env := FromMap(map[string]string{UnitEgressAllow.Name: bad})
		if env.UnitEgressAllow(); env.Err() == nil || !strings.HasPrefix(env.Err().Error(), "config: UNIT_EGRESS_ALLOW: ") {
			t.Errorf("UNIT_EGRESS_ALLOW=%s: %v", bad, env.Err())
		}
	}
	if got := FromMap(nil).UnitEgressAllow(); got != nil {
		t.Errorf("default allow list %v", got)
	}
}
