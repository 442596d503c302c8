// Package secretref reads a secret named by a reference, "env:NAME" or
// "file:/absolute/path", so that a key is configured by where it lives and
// never by its value. Errors name the reference, never the secret.
//
// It owns the reference syntax and the file checks (exists, a regular file,
// not readable by every user, not empty, bounded); it keeps nothing.
package secretref

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// MaxSize bounds a secret: far above any API key, small enough that a
// reference to a large file costs nothing.
const MaxSize = 4096

// Parse checks a reference's syntax and returns its kind ("env" or "file")
// and name (the variable, or the cleaned absolute path).
func Parse(ref string) (kind, name string, err error) {
	kind, name, ok := strings.Cut(ref, ":")
	switch {
	case !ok || ref == "":
		return "", "", errors.New(`a key reference must be "env:NAME" or "file:/absolute/path" (a key itself is never accepted)`)
	case kind == "env":
		if name == "" || strings.ContainsAny(name, "= \t\n\x00") {
			return "", "", fmt.Errorf("key reference env:%s: the variable name must be non-empty, without '=', spaces or NUL", name)
		}
		return kind, name, nil
	case kind == "file":
		if !filepath.IsAbs(name) || strings.ContainsRune(name, 0) {
			return "", "", fmt.Errorf("key reference file:%s: the path must be absolute", name)
		}
		return kind, filepath.Clean(name), nil
	}
	// The text before the colon is not repeated: a key pasted in place of
	// its reference must not reach an error message.
	return "", "", errors.New(`a key reference must be "env:NAME" or "file:/absolute/path" (a key itself is never accepted)`)
}

// Resolve reads the secret ref names. A file must be a regular file that
// every user cannot read (mode without o+r); its content, without
// surrounding white space, is the secret. A variable must be set and not
// empty.
func Resolve(ref string) (string, error) {
	kind, name, err := Parse(ref)
	if err != nil {
		return "", err
	}
	var v string
	if kind == "env" {
		val, ok := os.LookupEnv(name)
		if !ok {
			return "", fmt.Errorf("key reference env:%s: the environment variable %s is not set", name, name)
		}
		v = val
	} else if v, err = readFile(name); err != nil {
		return "", err
	}
	v = strings.TrimSpace(v)
	switch {
	case v == "":
		return "", fmt.Errorf("key reference %s:%s: the key is empty", kind, name)
	case len(v) > MaxSize:
		return "", fmt.Errorf("key reference %s:%s: the key is longer than %d bytes", kind, name, MaxSize)
	case strings.ContainsAny(v, "\r\n\x00"):
		return "", fmt.Errorf("key reference %s:%s: the key spans several lines", kind, name)
	}
	return v, nil
}

func readFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("key file %s does not exist", path)
		}
		return "", fmt.Errorf("key file %s cannot be opened: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("key file %s: %v", path, err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("key file %s is not a regular file", path)
	case fi.Mode().Perm()&0o004 != 0:
		return "", fmt.Errorf("key file %s is readable by every user (mode %04o): make it readable by its owner only (chmod 600)", path, fi.Mode().Perm())
	case fi.Size() > MaxSize+2:
		return "", fmt.Errorf("key file %s is larger than %d bytes: not a key", path, MaxSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+3))
	if err != nil {
		return "", fmt.Errorf("key file %s: %v", path, err)
	}
	return string(b), nil
}
