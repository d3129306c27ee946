// Package hermesplugin carries the host's Hermes plugin, embedded in the binary: the Python
// package Hermes loads from $HERMES_HOME/plugins/<Name>/ inside its own process, which
// reports the subagents Hermes delegates to the worker's hook socket and hands each running
// child its operator's messages and cancels between its steps (see hermes_host/__init__.py).
//
// The host installs Files under plugins/<Name>/ before every agent start and lists Name in
// config.yaml plugins.enabled. Its Python tests: hermesplugin/test_hermes_host.py.
package hermesplugin

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"path"
	"sort"
	"strconv"
)

// Name is the plugin's folder under plugins/, its name in plugin.yaml and in
// plugins.enabled. Hermes imports the folder as a Python package, so it is one.
const Name = "hermes_host"

// The files are named one by one: a folder pattern would leave out __init__.py (names
// starting with "_" are skipped) or, with all:, take in a __pycache__ a test run left.
//
//go:embed hermes_host/plugin.yaml hermes_host/__init__.py
var embedded embed.FS

// Files is the plugin: each file's path inside the plugin folder and its content. The map
// is the caller's own.
func Files() map[string][]byte {
	root, err := fs.Sub(embedded, Name)
	if err != nil {
		panic(err) // the embedded folder is fixed at build time
	}
	files := map[string][]byte{}
	err = fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(root, p)
		files[path.Clean(p)] = b
		return err
	})
	if err != nil {
		panic(err)
	}
	return files
}

// Version is a short digest of every file's path and content: it changes whenever any file
// does, and only then.
func Version() string { return digest(Files()) }

func digest(files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		// Lengths frame each part, so no two different sets of files hash alike.
		h.Write([]byte(strconv.Itoa(len(n)) + ":" + n + strconv.Itoa(len(files[n])) + ":"))
		h.Write(files[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}
