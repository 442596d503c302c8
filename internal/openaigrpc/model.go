// Package openaigrpc serves OpenAI chat and text completions from engines
// that speak SMG's gRPC engine protocol, where the caller, not the engine,
// turns text into token ids: it renders the model's chat template,
// tokenizes, calls Generate, and writes the engine's token stream back as
// the SSE or JSON answer an engine's own HTTP server gives. It knows
// nothing about routing or admission.
package openaigrpc

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/smg-project/smg/internal/chattemplate"
	"github.com/smg-project/smg/internal/tokenizer"
)

// Model is what serving one model over gRPC needs from its files: the
// tokenizer, the chat template (nil when the model has none: chat requests
// are refused with tmplErr) and the context length.
type Model struct {
	Tok     *tokenizer.Tokenizer
	Tmpl    *chattemplate.Template
	tmplErr error
	// MaxContext is the model's context in tokens (0: unknown).
	MaxContext int
	// Revision names the files: the archive's SHA-256 or the path.
	Revision string
}

// maxFileBytes bounds one file read from an archive or a folder.
const maxFileBytes = 64 << 20

// LoadArchive reads a tokenizer archive (a zip holding tokenizer.json and,
// optionally, tokenizer_config.json), as GetTokenizer streams it.
func LoadArchive(data []byte) (*Model, error) {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, fmt.Errorf("tokenizer archive is not a zip: %w", err)
	}
	files := map[string][]byte{}
	for _, f := range zr.File {
		name := filepath.Base(f.Name)
		if name != "tokenizer.json" && name != "tokenizer_config.json" {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return nil, fmt.Errorf("tokenizer archive: %s: %w", f.Name, err)
		}
		b, err := io.ReadAll(io.LimitReader(rc, maxFileBytes+1))
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("tokenizer archive: %s: %w", f.Name, err)
		}
		if len(b) > maxFileBytes {
			return nil, fmt.Errorf("tokenizer archive: %s is larger than %d MiB", f.Name, maxFileBytes>>20)
		}
		files[name] = b
	}
	sum := sha256.Sum256(data)
	return build(files, "sha256:"+hex.EncodeToString(sum[:]), "tokenizer archive")
}

// LoadPath reads --tokenizer-path: a folder with tokenizer.json (and
// tokenizer_config.json), a tokenizer.json file, or a zip archive.
func LoadPath(path string) (*Model, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		b, err := readFile(path)
		if err != nil {
			return nil, err
		}
		if bytes.HasPrefix(b, []byte("PK")) {
			return LoadArchive(b)
		}
		files := map[string][]byte{"tokenizer.json": b}
		if cfg, err := readFile(filepath.Join(filepath.Dir(path), "tokenizer_config.json")); err == nil {
			files["tokenizer_config.json"] = cfg
		}
		return build(files, path, path)
	}
	files := map[string][]byte{}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := readFile(filepath.Join(path, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		files[name] = b
	}
	return build(files, path, path)
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err == nil && len(b) > maxFileBytes {
		err = fmt.Errorf("%s is larger than %d MiB", path, maxFileBytes>>20)
	}
	return b, err
}

// build loads the tokenizer (required) and the chat template (optional).
func build(files map[string][]byte, revision, where string) (*Model, error) {
	tj, ok := files["tokenizer.json"]
	if !ok {
		return nil, fmt.Errorf("%s has no tokenizer.json", where)
	}
	var cfg io.Reader
	if c, ok := files["tokenizer_config.json"]; ok {
		cfg = bytes.NewReader(c)
	}
	tok, err := tokenizer.Load(bytes.NewReader(tj), tokenizer.Options{Config: cfg})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	m := &Model{Tok: tok, Revision: revision}
	if c, ok := files["tokenizer_config.json"]; ok {
		m.Tmpl, m.tmplErr = chattemplate.Load(bytes.NewReader(c))
		if m.Tmpl != nil {
			m.MaxContext = m.Tmpl.MaxLength()
		}
	} else {
		m.tmplErr = errors.New("the model ships no tokenizer_config.json, so no chat template")
	}
	return m, nil
}

// Fetch reads a worker's tokenizer archive and its context length.
type Fetch func(ctx context.Context) (archive []byte, maxContext int, err error)

// Models caches each worker's model, shared by every worker whose archive
// has the same digest (one parse per model and revision). A worker whose
// files cannot be read or loaded is tried again after RetryAfter.
type Models struct {
	// Fixed, when set (--tokenizer-path), serves every worker.
	Fixed *Model
	// RetryAfter is how long a failure is kept (0: 30 s).
	RetryAfter time.Duration
	// Timeout bounds one fetch (0: 60 s).
	Timeout time.Duration
	Now     func() time.Time // nil: time.Now

	mu      sync.Mutex
	workers map[string]*entry
	byRev   map[string]*Model
}

type entry struct {
	done  chan struct{}
	model *Model
	err   error
	at    time.Time
}

// ForWorker returns the model of the worker at url, fetching it on first
// use (callers of the same worker wait for the one fetch, each within its
// own ctx). The error names the worker.
func (c *Models) ForWorker(ctx context.Context, url string, fetch Fetch) (*Model, error) {
	if c.Fixed != nil {
		return c.Fixed, nil
	}
	now := c.now()
	c.mu.Lock()
	if c.workers == nil {
		c.workers, c.byRev = map[string]*entry{}, map[string]*Model{}
	}
	e := c.workers[url]
	if e != nil {
		select {
		case <-e.done:
			if e.err != nil && now.Sub(e.at) >= c.retryAfter() {
				e = nil // try again
			}
		default:
		}
	}
	if e == nil {
		e = &entry{done: make(chan struct{})}
		c.workers[url] = e
		go c.load(url, e, fetch)
	}
	c.mu.Unlock()
	select {
	case <-e.done:
		return e.model, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *Models) load(url string, e *entry, fetch Fetch) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m, err := func() (*Model, error) {
		data, maxContext, err := fetch(ctx)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		rev := "sha256:" + hex.EncodeToString(sum[:])
		c.mu.Lock()
		m := c.byRev[rev]
		c.mu.Unlock()
		if m == nil {
			if m, err = LoadArchive(data); err != nil {
				return nil, err
			}
		}
		c.mu.Lock()
		c.byRev[rev] = m
		c.mu.Unlock()
		if maxContext > 0 && maxContext != m.MaxContext {
			cp := *m // the engine's context, not the config's, bounds this worker
			cp.MaxContext = maxContext
			m = &cp
		}
		return m, nil
	}()
	if err != nil {
		err = fmt.Errorf("worker %s: tokenizer cannot be loaded: %w", url, err)
	}
	c.mu.Lock()
	e.model, e.err, e.at = m, err, c.now()
	c.mu.Unlock()
	close(e.done)
}

// Forget drops the workers not in keep.
func (c *Models) Forget(keep func(url string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for u := range c.workers {
		if !keep(u) {
			delete(c.workers, u)
		}
	}
}

func (c *Models) retryAfter() time.Duration {
	if c.RetryAfter > 0 {
		return c.RetryAfter
	}
	return 30 * time.Second
}

func (c *Models) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}
