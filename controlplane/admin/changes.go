package admin

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Operations of a Change.
const (
	OpSubmit   = "submit"   // a registration job starts (create or replace)
	OpJob      = "job"      // a job's state moves (processing, failed)
	OpRegister = "register" // a job succeeded: the worker is stored and the job is done, at once
	OpUpdate   = "update"   // PATCH of a stored worker's spec
	OpDelete   = "delete"   // a worker and its job go
)

// Change is one durable change to the registry: the admin API's intent,
// never a load or a verdict. A replicated control plane puts Changes in its
// log; ApplyChange is deterministic, so every replica that applies the same
// Changes in the same order holds the same workers and jobs. Everything a
// replica needs is in the Change (time included): nothing is read from the
// clock or the network while applying.
type Change struct {
	Op       string    `json:"op"`
	WorkerID string    `json:"worker_id"`
	Token    string    `json:"token,omitempty"` // the registration job this change belongs to
	Kind     string    `json:"kind,omitempty"`  // submit: create or replace
	Spec     []byte    `json:"spec,omitempty"`  // submit, register: the WorkerSpec, protobuf
	Update   []byte    `json:"update,omitempty"`
	State    string    `json:"state,omitempty"` // job
	Message  string    `json:"message,omitempty"`
	Model    string    `json:"model,omitempty"` // register
	At       time.Time `json:"at"`
}

// ApplyChange applies one change in one registry write transaction. A change
// the current state refuses (the worker exists, is gone, the job was
// superseded) returns the admin API's error and changes nothing.
func ApplyChange(reg *registry.Registry, resolve ThresholdResolver, c *Change) (*registry.Worker, error) {
	var old *registry.Worker
	_, err := reg.Update(func(t *registry.Txn) error {
		var err error
		old, err = applyChange(t, resolve, c)
		return err
	})
	return old, err // applyChange returns no record with an error
}

func applyChange(t *registry.Txn, resolve ThresholdResolver, c *Change) (*registry.Worker, error) {
	switch c.Op {
	case OpSubmit:
		return nil, applySubmit(t, c)
	case OpJob:
		cur := t.Job(c.WorkerID)
		if cur == nil || cur.Token != c.Token || !running(cur) {
			return nil, nil // superseded (deleted, re-registered) or already finished
		}
		j := *cur
		j.State, j.Message, j.UpdatedAt = c.State, c.Message, c.At
		t.PutJob(&j)
		return nil, nil
	case OpRegister:
		return applyRegister(t, resolve, c)
	case OpUpdate:
		return nil, applyUpdate(t, c)
	case OpDelete:
		old := t.Get(c.WorkerID)
		if old == nil {
			if j := t.Job(c.WorkerID); j != nil && running(j) {
				t.DeleteJob(c.WorkerID) // the registration finds itself superseded
				return nil, nil
			}
			return nil, errNotFound(c.WorkerID)
		}
		t.DeleteJob(c.WorkerID)
		t.Delete(c.WorkerID)
		return old, nil
	}
	return nil, fmt.Errorf("unknown change %q", c.Op)
}

func applySubmit(t *registry.Txn, c *Change) error {
	spec := &smgv1.WorkerSpec{}
	if err := proto.Unmarshal(c.Spec, spec); err != nil {
		return fmt.Errorf("submit %s: spec: %w", c.WorkerID, err)
	}
	id := c.WorkerID
	inProgress := func() bool {
		j := t.Job(id)
		return j != nil && running(j)
	}
	switch c.Kind {
	case "create":
		if t.GetByURL(spec.GetUrl()) != nil || t.Get(id) != nil || inProgress() {
			return errExists(spec.GetUrl())
		}
	case "replace":
		if t.Get(id) == nil {
			return errNotFound(id)
		}
		if other := t.GetByURL(spec.GetUrl()); other != nil && other.ID != id {
			return errExists(spec.GetUrl())
		}
		if inProgress() {
			return errInProgress(id)
		}
	default:
		return fmt.Errorf("unknown job kind %q", c.Kind)
	}
	t.PutJob(&registry.Job{WorkerID: id, URL: spec.GetUrl(), Kind: c.Kind, State: "pending", UpdatedAt: c.At, Spec: spec, Token: c.Token})
	return nil
}

func applyRegister(t *registry.Txn, resolve ThresholdResolver, c *Change) (*registry.Worker, error) {
	job := t.Job(c.WorkerID)
	if job == nil || job.Token != c.Token || !running(job) {
		return nil, errors.New("registration superseded")
	}
	spec := job.Spec
	if len(c.Spec) > 0 { // the spec as stored, e.g. with the bootstrap port the engine reported
		spec = &smgv1.WorkerSpec{}
		if err := proto.Unmarshal(c.Spec, spec); err != nil {
			return nil, fmt.Errorf("register %s: spec: %w", c.WorkerID, err)
		}
	}
	th, err := resolve(spec.GetOverload())
	if err != nil {
		return nil, err
	}
	if other := t.GetByURL(spec.GetUrl()); other != nil && other.ID != job.WorkerID {
		return nil, fmt.Errorf("a worker with url %q already exists", spec.GetUrl())
	}
	health := registry.HealthPending
	if spec.GetProvider() != nil {
		health = registry.HealthHealthy // never probed: routable once registered
	}
	w := &registry.Worker{Registered: registry.Registered{ID: job.WorkerID}, State: registry.State{Health: health}}
	old := t.Get(job.WorkerID)
	if old != nil {
		if job.Kind != "replace" {
			return nil, fmt.Errorf("worker %s already exists", job.WorkerID)
		}
		w = old.Clone()
		if old.Spec.GetUrl() != spec.GetUrl() || old.External() != (spec.GetProvider() != nil) {
			w.Health, w.Load, w.AgentNode = health, nil, ""
		}
		// A replaced worker starts with no overload veto: its last load is no
		// fresh signal for the new spec (fail open until the next report).
		// Liveness vetoes end only on their own rule's evidence.
		w.Evidence.NoReport = true
	} else if job.Kind == "replace" {
		return nil, fmt.Errorf("worker %s was removed", job.WorkerID)
	}
	w.Spec, w.Model, w.Type, w.Thresholds = spec, c.Model, workerType(spec), th
	t.Insert(w)
	done := *job
	done.State, done.Message, done.UpdatedAt = "done", "registered", c.At
	t.PutJob(&done)
	return old, nil
}

func applyUpdate(t *registry.Txn, c *Change) error {
	u := &smgv1.WorkerUpdate{}
	if err := proto.Unmarshal(c.Update, u); err != nil {
		return fmt.Errorf("update %s: %w", c.WorkerID, err)
	}
	w := t.Get(c.WorkerID)
	if w == nil {
		return errNotFound(c.WorkerID)
	}
	if w.Spec.GetProvider() != nil && (u.ApiKey != nil || u.Node != nil || u.LoadMonitorIntervalSecs != nil || u.MaxRunningRequests != nil) {
		return errBadRequest("update", "an external worker takes no api_key (its key is provider.api_key_ref), node, load_monitor_interval_secs or max_running_requests; replace its spec with PUT /workers/{worker_id}")
	}
	n := w.Clone()
	n.Spec = proto.CloneOf(w.Spec)
	// Each field the update sets replaces the spec's field of the same name,
	// but the overload block: PATCH keeps it.
	spec := n.Spec.ProtoReflect()
	u.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != "overload" {
			spec.Set(spec.Descriptor().Fields().ByName(fd.Name()), v)
		}
		return true
	})
	n.Evidence.NoReport = true // the spec: PATCH replaces the worker, which clears its overload veto
	t.Insert(n)
	return nil
}

// Durable is the replicated part of the registry: what a snapshot of the
// log holds. Loads, verdicts and health are not in it.
type Durable struct {
	Workers []DurableWorker `json:"workers"`
	Jobs    []DurableJob    `json:"jobs"`
}

// DurableWorker is a worker's registration.
type DurableWorker struct {
	ID    string `json:"id"`
	Spec  []byte `json:"spec"`
	Model string `json:"model"`
}

// DurableJob is a registration job and its outcome.
type DurableJob struct {
	WorkerID  string    `json:"worker_id"`
	Kind      string    `json:"kind"`
	State     string    `json:"state"`
	Message   string    `json:"message"`
	UpdatedAt time.Time `json:"updated_at"`
	Spec      []byte    `json:"spec"`
	Token     string    `json:"token"`
}

// DurableState reads the durable part of snap.
func DurableState(snap *registry.Snapshot) (*Durable, error) {
	d := &Durable{}
	for _, w := range snap.Workers() {
		b, err := proto.Marshal(w.Spec)
		if err != nil {
			return nil, err
		}
		d.Workers = append(d.Workers, DurableWorker{ID: w.ID, Spec: b, Model: w.Model})
	}
	for _, j := range snap.Jobs() {
		b, err := proto.Marshal(j.Spec)
		if err != nil {
			return nil, err
		}
		d.Jobs = append(d.Jobs, DurableJob{WorkerID: j.WorkerID, Kind: j.Kind, State: j.State, Message: j.Message, UpdatedAt: j.UpdatedAt, Spec: b, Token: j.Token})
	}
	return d, nil
}

// RestoreDurable makes the registry hold exactly d's workers and jobs, in
// one transaction. A worker whose registration is unchanged keeps its record
// (and so its soft state); a new one starts pending, like any registration.
func RestoreDurable(reg *registry.Registry, resolve ThresholdResolver, d *Durable) error {
	_, err := reg.Update(func(t *registry.Txn) error {
		keep := map[string]bool{}
		for _, dw := range d.Workers {
			spec := &smgv1.WorkerSpec{}
			if err := proto.Unmarshal(dw.Spec, spec); err != nil {
				return fmt.Errorf("worker %s: spec: %w", dw.ID, err)
			}
			keep[dw.ID] = true
			if cur := t.Get(dw.ID); cur != nil && proto.Equal(cur.Spec, spec) && cur.Model == dw.Model {
				continue
			}
			th, err := resolve(spec.GetOverload())
			if err != nil {
				return fmt.Errorf("worker %s: %w", dw.ID, err)
			}
			t.Insert(&registry.Worker{Registered: registry.Registered{ID: dw.ID, Spec: spec, Model: dw.Model, Type: workerType(spec), Thresholds: th}, State: registry.State{Health: registry.HealthPending}})
		}
		for _, w := range t.Workers() {
			if !keep[w.ID] {
				t.Delete(w.ID)
			}
		}
		for _, j := range t.Jobs() { // jobs hold no soft state: d's replace them all
			t.DeleteJob(j.WorkerID)
		}
		for _, dj := range d.Jobs {
			spec := &smgv1.WorkerSpec{}
			if err := proto.Unmarshal(dj.Spec, spec); err != nil {
				return fmt.Errorf("job %s: spec: %w", dj.WorkerID, err)
			}
			t.PutJob(&registry.Job{WorkerID: dj.WorkerID, URL: spec.GetUrl(), Kind: dj.Kind, State: dj.State, Message: dj.Message, UpdatedAt: dj.UpdatedAt, Spec: spec, Token: dj.Token})
		}
		return nil
	})
	return err
}

// running reports whether a job has not finished.
func running(j *registry.Job) bool { return j.State == "pending" || j.State == "processing" }
