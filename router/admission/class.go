package admission

import "strings"

// Class is a priority class; a lower value is a higher priority.
type Class uint8

// The four classes, highest first.
const (
	System Class = iota
	Interactive
	Default
	Bulk
	NumClasses = 4
)

var classNames = [NumClasses]string{"system", "interactive", "default", "bulk"}

// Classes lists every class, highest first.
var Classes = [NumClasses]Class{System, Interactive, Default, Bulk}

func (c Class) String() string {
	if c < NumClasses {
		return classNames[c]
	}
	return "unknown"
}

// ParseClass reads a class name as the header carries it: case-insensitive,
// surrounding whitespace trimmed. Anything else, the empty string too, is
// Default with ok false (the caller counts it; it is never an error).
func ParseClass(s string) (c Class, ok bool) {
	s = strings.TrimSpace(s)
	for i, n := range classNames {
		if strings.EqualFold(s, n) {
			return Class(i), true
		}
	}
	return Default, false
}

// Clamp lowers c to at most max (a tenant's max_class): it never raises a class.
func Clamp(c, max Class) Class {
	if c < max {
		return max
	}
	return c
}
