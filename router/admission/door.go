package admission

import "context"

// Door is the first layer: whether a request may start in this router now,
// after waiting its turn, or not at all. Limiter and Scheduler are doors.
type Door interface {
	// Admit waits for a request of class c to be let in. On Admitted it
	// holds a place until Release; any other Result is a refusal the caller
	// answers. A nil ticket is a place that is never preempted.
	Admit(ctx context.Context, c Class) (*Ticket, Result)
	// Release gives the place of an admitted request back (its answer ended).
	Release(t *Ticket)
	// Waiting is the number of requests queued that a newcomer of class c
	// would wait behind.
	Waiting(c Class) int64
}

// Result says how Admit ended.
type Result uint8

const (
	Admitted      Result = iota // holds a place: Release it when the answer ends
	QueueFull                   // refused at once: the queue is full
	QueueTimeout                // waited past the queue's timeout
	Cancelled                   // the client left while waiting
	OverFairShare               // refused at once: the tenant holds its fair share while others are active (Scheduler.AdmitTenant)
)
