package sim

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
)

// ErrClosed is returned by SetFault on a closed server.
var ErrClosed = errors.New("sim: server closed")

// Server is one simulated engine behind a real HTTP listener.
type Server struct {
	opts  Options
	log   *slog.Logger
	index int
	fleet []*Server // every engine of the process, this one included
	addr  string    // host:port, kept across kill and revive
	// grpcAddr is the gRPC host:port ("" without gRPC), kept across kill and revive.
	grpcAddr string
	started  atomic.Int64 // unix ns the engine (re)started: a revive is a new process
	metrics  http.Handler
	client   *http.Client // decode role: talks to prefill engines
	mux      *http.ServeMux
	throttle atomic.Int64 // Fault.Throttle: Retry-After of the 429 answers (0: none)

	resetting atomic.Bool
	silent    atomic.Bool
	garbage   atomic.Bool
	eng       atomic.Pointer[engine] // nil while killed
	handlers  sync.WaitGroup

	grpcReqs  grpcRequests
	kvStreams atomic.Int64 // SubscribeKvEvents streams open
	getLoads  atomic.Int64 // GetLoads calls answered

	mu    sync.Mutex
	fault Fault
	hs    *http.Server
	gs    *grpc.Server
	// connMu guards conns alone: http.Server.Close (under mu, in killLocked)
	// waits for its Serve loop, which may be in trackConn at that moment.
	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	timers map[*time.Timer]struct{}
	closed bool
}

// Start serves one engine on addr ("127.0.0.1:0" picks a free port).
func Start(addr string, opts Options, log *slog.Logger) (*Server, error) {
	s, err := newServer(0, opts, log)
	if err != nil {
		return nil, err
	}
	s.fleet = []*Server{s}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim: listen %s: %w", addr, err)
	}
	var gln net.Listener
	if opts.GRPC {
		host, _, _ := net.SplitHostPort(addr)
		if gln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(opts.GRPCPort))); err != nil {
			ln.Close()
			return nil, fmt.Errorf("sim: listen gRPC: %w", err)
		}
	}
	if err := s.serve(ln, gln); err != nil {
		return nil, err
	}
	return s, nil
}

// StartFleet serves count independent engines on host:port .. host:port+count-1
// (every one on a free port when port is 0). Engine i uses seed opts.Seed+i.
// Each engine's /sim/fault reaches its siblings with ?engine=N.
func StartFleet(host string, port, count int, opts Options, log *slog.Logger) ([]*Server, error) {
	if count < 1 {
		return nil, fmt.Errorf("sim: count must be >= 1, got %d", count)
	}
	fleet := make([]*Server, count)
	for i := range fleet {
		o := opts
		o.Seed = opts.Seed + uint64(i)
		s, err := newServer(i, o, log)
		if err != nil {
			return nil, err
		}
		fleet[i] = s
	}
	// Bind every port before serving any, so that no sibling's fault API
	// sees an address still being chosen.
	lns := make([]net.Listener, 0, 2*count) // engine i: lns[2i] HTTP, lns[2i+1] gRPC or nil
	closeAll := func(ls []net.Listener) {
		for _, l := range ls {
			if l != nil {
				l.Close()
			}
		}
	}
	for i, s := range fleet {
		s.fleet = fleet
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(portOf(port, i))))
		if err != nil {
			closeAll(lns)
			return nil, fmt.Errorf("sim: engine %d: listen: %w", i, err)
		}
		lns = append(lns, ln)
		var gln net.Listener
		if opts.GRPC {
			if gln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(portOf(opts.GRPCPort, i)))); err != nil {
				closeAll(lns)
				return nil, fmt.Errorf("sim: engine %d: listen gRPC: %w", i, err)
			}
		}
		lns = append(lns, gln)
	}
	for i, s := range fleet {
		if err := s.serve(lns[2*i], lns[2*i+1]); err != nil {
			for _, started := range fleet[:i] {
				started.Close()
			}
			closeAll(lns[2*i:])
			return nil, fmt.Errorf("sim: engine %d: %w", i, err)
		}
	}
	return fleet, nil
}

// portOf is engine i's port when the first listens on base (0: a free port).
func portOf(base, i int) int {
	if base == 0 {
		return 0
	}
	return base + i
}

func newServer(index int, opts Options, log *slog.Logger) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		opts: opts, log: log.With("engine", index), index: index,
		conns: map[net.Conn]struct{}{}, timers: map[*time.Timer]struct{}{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(s))
	s.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	s.mux = s.routes()
	return s, nil
}

// serve starts serving on ln (and gln, the gRPC listener, when not nil) for
// the first time and applies the start-time faults.
func (s *Server) serve(ln, gln net.Listener) error {
	s.addr = ln.Addr().String()
	if gln != nil {
		s.grpcAddr = gln.Addr().String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serveLocked(ln, gln)
	f := s.opts.Fault
	s.fault = Fault{}
	return s.applyLocked(f, nil)
}

func (s *Server) serveLocked(ln, gln net.Listener) {
	s.started.Store(time.Now().UnixNano())
	e := newEngine(configFrom(s.opts), s.opts.DPSize, s.opts.Seed, s.fetchKV)
	e.setFault(s.fault)
	e.start()
	s.eng.Store(e)
	hs := &http.Server{
		Handler:           s.provider(s.mux),
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: s.trackConn,
		ErrorLog:  slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.hs = hs
	go func() {
		var l net.Listener = resetListener{ln, &s.resetting}
		if s.opts.TLS != nil {
			l = tls.NewListener(l, s.opts.TLS)
		}
		if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve", "err", err)
		}
	}()
	s.log.Info("engine listening", "url", s.URL(), "flavor", s.opts.Flavor, "role", s.opts.Role)
	if gln != nil {
		s.serveGRPCLocked(gln)
	}
}

type connKey struct{}

func (s *Server) trackConn(c net.Conn, st http.ConnState) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	switch st {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// URL is the engine's base URL, http://host:port.
func (s *Server) URL() string {
	if s.opts.TLS != nil {
		return "https://" + s.addr
	}
	return "http://" + s.addr
}

// Addr is the engine's host:port.
func (s *Server) Addr() string { return s.addr }

// startedAt is when the engine's process started: at Start, and again at
// each revive (process_start_time_seconds moves as a restarted engine's does).
func (s *Server) startedAt() time.Time { return time.Unix(0, s.started.Load()) }

// Index is the engine's position in its fleet (0 for Start).
func (s *Server) Index() int { return s.index }

// Fault returns the faults the engine shows now.
func (s *Server) Fault() Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// SetFault replaces the engine's faults. Clearing Kill listens again on the
// same address with a fresh engine; the error says when that failed.
func (s *Server) SetFault(f Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(f, nil)
}

// applyLocked moves from s.fault to f. keep is a connection a reset spares
// (the one asking for it, which is told to close instead).
func (s *Server) applyLocked(f Fault, keep net.Conn) error {
	if s.closed {
		return ErrClosed
	}
	if f.Slow < 0 {
		return errors.New("sim: slow multiplier must be >= 0")
	}
	if f.Throttle < 0 {
		return errors.New("sim: throttle Retry-After must be >= 0")
	}
	s.throttle.Store(int64(f.Throttle))
	old := s.fault
	s.fault = f
	s.silent.Store(f.SilentMetrics)
	s.garbage.Store(f.GarbageMetrics)
	s.resetting.Store(f.Reset)
	switch {
	case f.Kill && !old.Kill:
		s.killLocked()
	case !f.Kill && old.Kill:
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			s.fault.Kill = true
			return fmt.Errorf("sim: revive %s: %w", s.addr, err)
		}
		var gln net.Listener
		if s.grpcAddr != "" {
			if gln, err = net.Listen("tcp", s.grpcAddr); err != nil {
				ln.Close()
				s.fault.Kill = true
				return fmt.Errorf("sim: revive %s: %w", s.grpcAddr, err)
			}
		}
		s.serveLocked(ln, gln)
		s.log.Info("engine revived")
	}
	if e := s.eng.Load(); e != nil {
		e.setFault(f)
	}
	if f.Reset && !old.Reset && !f.Kill {
		s.connMu.Lock()
		for c := range s.conns {
			if c != keep {
				abortConn(c)
			}
		}
		s.connMu.Unlock()
	}
	if f != old {
		s.log.Info("fault set", "fault", fmt.Sprintf("%+v", f))
	}
	return nil
}

// killLocked closes the listener, cuts every connection and drops the engine's
// state, like a process that died.
func (s *Server) killLocked() {
	if s.hs != nil {
		s.hs.Close()
		s.hs = nil
	}
	if s.gs != nil {
		s.gs.Stop() // closes the listener and every connection, ending every call
		s.gs = nil
	}
	if e := s.eng.Swap(nil); e != nil {
		e.close()
	}
	s.connMu.Lock()
	clear(s.conns)
	s.connMu.Unlock()
}

// Close stops the engine for good and waits for its handlers to return.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for t := range s.timers {
		t.Stop()
	}
	s.killLocked()
	s.mu.Unlock()
	s.handlers.Wait()
	s.client.CloseIdleConnections()
	return nil
}

// resetListener resets every connection it accepts while on is set.
type resetListener struct {
	net.Listener
	on *atomic.Bool
}

func (l resetListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || !l.on.Load() {
			return c, err
		}
		abortConn(c)
	}
}

// abortConn closes c with a TCP reset instead of an orderly shutdown.
func abortConn(c net.Conn) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // a TLS connection: reset the TCP one under it
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// fetchKV is the decode role's handover: it asks the prefill engine at
// host:port (its HTTP port) for room's KV and waits for the answer.
func (s *Server) fetchKV(ctx context.Context, host string, port int, room uint64) error {
	body, _ := json.Marshal(map[string]uint64{"bootstrap_room": room})
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/sim/bootstrap"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("kv transfer from %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("kv transfer from %s failed: %d %s", url, resp.StatusCode, e.Error.Message)
	}
	return nil
}

// track counts a handler so Close can wait for it.
func (s *Server) track(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.handlers.Add(1)
		defer s.handlers.Done()
		h(w, r)
	}
}

func (s *Server) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("POST /v1/chat/completions", s.track(s.handleChat))
	m.HandleFunc("POST /v1/completions", s.track(s.handleCompletion))
	m.HandleFunc("GET /v1/models", s.handleModels)
	m.HandleFunc("GET /health", s.handleHealth)
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("GET /sim/fault", s.handleFault)
	m.HandleFunc("POST /sim/fault", s.handleFault)
	m.HandleFunc("GET /sim/stats", s.handleStats)
	if s.opts.Role == RolePrefill {
		m.HandleFunc("POST /sim/bootstrap", s.track(s.handleBootstrap))
	}
	if s.opts.Flavor == FlavorSGLang || s.opts.Role == RolePrefill {
		// SGLang's PD bootstrap is what every prefill engine speaks here,
		// so a prefill of either flavor tells its bootstrap port.
		m.HandleFunc("GET /server_info", s.handleServerInfo)
		m.HandleFunc("GET /get_server_info", s.handleServerInfo)
	}
	if s.opts.Flavor == FlavorSGLang {
		m.HandleFunc("GET /v1/loads", s.handleLoads)
		m.HandleFunc("GET /get_load", s.handleGetLoad)
		m.HandleFunc("GET /get_model_info", s.handleModelInfo)
	}
	return m
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleBootstrap(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Room *uint64 `json:"bootstrap_room"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Room == nil {
		writeError(w, http.StatusBadRequest, "body must be {\"bootstrap_room\": N}")
		return
	}
	e := s.eng.Load()
	if e == nil {
		writeError(w, http.StatusServiceUnavailable, errEngineStopped.Error())
		return
	}
	if err := e.Bootstrap(r.Context(), *body.Room); err != nil {
		writeError(w, http.StatusGone, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"transferred"}`))
}

// errorBody is the OpenAI error shape.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func errorJSON(status int, msg string) []byte {
	var e errorBody
	e.Error.Message, e.Error.Code = msg, status
	switch {
	case status == http.StatusNotFound:
		e.Error.Type = "NotFoundError"
	case status < 500:
		e.Error.Type = "BadRequestError"
	default:
		e.Error.Type = "InternalServerError"
	}
	b, _ := json.Marshal(e)
	return b
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorJSON(status, msg))
}
