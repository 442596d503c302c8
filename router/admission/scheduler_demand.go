package admission

import (
	"math"
	"time"
)

// demandTau is the memory of a class's arrival rate: a few seconds, so a
// reservation that follows demand rises within a second or two of a surge of
// the class's arrivals and falls back as they pass.
const demandTau = 2 * time.Second

// idleDemand is the mean demand under which a class or tenant has gone
// quiet (a stream of mean demand 3 falls under it within 12 s of its last
// arrival): it is kept no slot, instead of one to the end of time.
const idleDemand = 0.01

// holdAlpha is the weight of one answer in a class's mean slot-holding time.
const holdAlpha = 0.2

// classDemand estimates the slots a class would keep busy if every one of its
// arrivals were admitted (Little's law: arrival rate × mean holding time).
// It is what a reservation that follows demand (reserve_demand) holds back
// from lower classes. Guarded by the scheduler's lock.
type classDemand struct {
	arrivals float64   // exponentially decayed count of arrivals (each adds 1, decays by e^(-dt/tau))
	last     time.Time // when arrivals was last decayed
	first    time.Time // the first arrival of the current stream (after a silence)
	hold     float64   // mean seconds an admitted request held its slot (0: none ended yet)
	ended    bool      // an admitted request has ended: hold is measured
}

func (d *classDemand) decay(now time.Time) {
	if dt := now.Sub(d.last); dt > 0 {
		d.arrivals *= math.Exp(-dt.Seconds() / demandTau.Seconds())
		d.last = now
	}
}

// arrive counts one arrival at now.
func (d *classDemand) arrive(now time.Time) {
	d.decay(now)
	if d.arrivals < idleDemand {
		d.first = now // a new stream: nothing left of the last one
	}
	d.arrivals++
}

// held folds one admitted request's slot time into the mean.
func (d *classDemand) held(dt time.Duration) {
	d.ended = true
	if d.hold == 0 {
		d.hold = dt.Seconds()
		return
	}
	d.hold += holdAlpha * (dt.Seconds() - d.hold)
}

// slots is the reservation the demand asks for at now, since is when the
// counting began (the rate is corrected for a history shorter than tau):
// the mean demand plus one standard deviation of a Poisson arrival count,
// so a steady stream finds a free slot most of the time.
func (d *classDemand) slots(now, since time.Time) int64 { return d.slotsSD(now, since, 1) }

// slotsSD is the mean demand plus sd standard deviations.
func (d *classDemand) slotsSD(now, since time.Time, sd float64) int64 {
	mean := d.mean(now, since)
	if mean < idleDemand {
		return 0 // gone quiet: no slot is kept for arrivals that stopped
	}
	return int64(math.Ceil(mean + sd*math.Sqrt(mean)))
}

// mean is the slots the arrivals keep busy on average at now, since is when
// the counting began (the rate is corrected for a history shorter than tau).
func (d *classDemand) mean(now, since time.Time) float64 {
	d.decay(now)
	if d.hold <= 0 || d.arrivals <= 0 {
		return 0
	}
	tau := demandTau.Seconds()
	span := 1 - math.Exp(-max(now.Sub(since).Seconds(), 0.001)/tau)
	return d.arrivals / (tau * span) * d.hold
}

// streamMean is a tenant's mean demand: the slots its arrivals keep busy on
// average at now. It differs from mean in two ways, both for a stream's
// first seconds. Its rate is measured from the stream's own first arrival
// (not from when the counting began, which may be long before), leaving that
// arrival out (one arrival measures no rate) and over at least one holding
// time (two requests sent together are not a rate of thousands a second).
// And until one of its answers has ended, it assumes prior as the holding
// time (0: no demand until then).
func (d *classDemand) streamMean(now time.Time, prior float64) float64 {
	later, elapsed, hold := d.stream(now, prior)
	if later == 0 {
		return 0
	}
	tau := demandTau.Seconds()
	span := 1 - math.Exp(-max(elapsed, hold)/tau)
	return later / (tau * span) * hold
}

// stream is what streamMean and onsetMean measure a stream's rate from:
// its arrivals since its first (that one left out; 0 when there are none,
// or no holding time to weigh them by), the seconds since that first, and
// the holding time (prior until one of its answers has ended).
func (d *classDemand) stream(now time.Time, prior float64) (later, elapsed, hold float64) {
	d.decay(now)
	hold = d.hold
	if !d.ended {
		hold = prior
	}
	elapsed = max(now.Sub(d.first).Seconds(), 0)
	later = d.arrivals - math.Exp(-elapsed/demandTau.Seconds())
	if hold <= 0 || later <= 0 {
		later = 0
	}
	return later, elapsed, hold
}

// onsetMean is the slots a stream's arrivals since its first (that one
// left out) would keep busy at the rate they came in at, over the time
// since (not over at least one holding time, as streamMean), less
// headroomSD standard deviations of their Poisson count; prior as in
// streamMean. A flood shows its rate within a few arrivals; a steady
// stream's few arrivals, however close together, show nothing sure (0).
func (d *classDemand) onsetMean(now time.Time, prior float64) float64 {
	later, elapsed, hold := d.stream(now, prior)
	if later == 0 || elapsed <= 0 {
		return 0
	}
	sure := later - headroomSD*math.Sqrt(later)
	if sure <= 0 {
		return 0
	}
	tau := demandTau.Seconds()
	return sure / (tau * (1 - math.Exp(-elapsed/tau))) * hold
}

// streamSlots is streamMean plus sd standard deviations of a Poisson
// arrival count, in whole slots (0 once the stream has gone quiet).
func (d *classDemand) streamSlots(now time.Time, sd, prior float64) int64 {
	mean := d.streamMean(now, prior)
	if mean < idleDemand {
		return 0
	}
	return int64(math.Ceil(mean + sd*math.Sqrt(mean)))
}

// DefaultHoldPrior is the slot-holding time a tenant's demand assumes while
// no answer has ended on this router yet: an LLM answer holds its slot about
// a second or more, and a tenant's demand of 0 would let another tenant take
// every slot in a run's first second, kept until those answers end.
const DefaultHoldPrior = time.Second

// holdPriorLocked is the holding time a tenant's demand assumes until one of
// its own answers has ended: the mean over every answer ended here, else
// DefaultHoldPrior, or longer while a request in flight has already held its
// slot longer (a lower bound on the holding time).
func (s *Scheduler) holdPriorLocked(now time.Time) float64 {
	if s.answers.ended {
		return s.answers.hold
	}
	prior := DefaultHoldPrior
	for _, c := range Classes {
		if e := s.running[c].Front(); e != nil {
			prior = max(prior, now.Sub(e.Value.(*Ticket).admitted))
		}
	}
	return prior.Seconds()
}
