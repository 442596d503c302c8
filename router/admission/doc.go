// Package admission answers, for a router, "may this request go now, must it
// wait, or is it refused?". It owns every waiting mechanism of a router and
// the one priority class type (Class). It knows no HTTP and sends no request:
// the router asks it and writes the answers.
//
// Two layers, asked in this order:
//
//  1. The door (Door), once per request, before its body is read: may it
//     start in this router at all? One of
//     - Limiter: SMG's token bucket (--max-concurrent-requests,
//     --rate-limit-tokens-per-second, --queue-size, --queue-timeout-secs);
//     one first-come-first-served queue;
//     - Scheduler: SMG's priority scheduler (--priority-scheduler-enabled):
//     a queue per Class, reservations, starvation promotion, preemption
//     before the first byte, against a capacity the router keeps live.
//     With neither, every request starts.
//  2. The rooms (Gate, Waitlist), once per attempt, after selection: may it
//     go to that worker now? A Gate is this router's part of one worker's
//     running window (taking a room is lock-free); a Waitlist holds, per pool
//     of workers, the requests that found no room, highest Class first, and
//     hands each freed room to its head. Its waiting demand is what the
//     router reports to the control plane so window shares follow it.
//
// Time comes from the caller's clock (Options.Now in a router) wherever a
// rule depends on it.
package admission
