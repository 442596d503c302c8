package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// splitter cuts a normalized segment into pre-tokens, in order, covering it.
type splitter func(s string, emit func(piece string))

// knownSplits are the Split patterns of the models this package serves,
// implemented by hand: Go's regexp has no lookahead, which all of them use
// (`\s+(?!\S)`). Each is a scanner with the pattern's leftmost-first,
// backtracking semantics.
var knownSplits = map[string]splitter{
	// Llama 3 (and OpenAI's cl100k): digits in runs of up to three.
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`: cl100kSplit(3),
	// Qwen 2 and 3: every digit alone.
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`: cl100kSplit(1),
}

func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isNewline(r rune) bool {
	return r == '\r' || r == '\n'
}

// cl100kSplit is the scanner of
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func cl100kSplit(maxDigits int) splitter {
	return func(s string, emit func(string)) {
		for i := 0; i < len(s); {
			n := contraction(s[i:], true)
			if n == 0 {
				n = cl100kRest(s[i:], maxDigits)
			}
			emit(s[i : i+n])
			i += n
		}
	}
}

// cl100kRest matches the alternatives after the contractions at the start
// of s; it always matches at least one rune.
func cl100kRest(s string, maxDigits int) int {
	r0, n0 := utf8.DecodeRuneInString(s)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if !isNewline(r0) && !isLetter(r0) && !isNumber(r0) {
		if n := runOf(s[n0:], isLetter, 0); n > 0 {
			return n0 + n
		}
	} else if isLetter(r0) {
		return runOf(s, isLetter, 0)
	}
	// \p{N}{1,maxDigits}
	if isNumber(r0) {
		return runOf(s, isNumber, maxDigits)
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	if n := punct(s); n > 0 {
		return n
	}
	// r0 is whitespace from here on.
	return spaces(s)
}

// punct matches ` ?[^\s\p{L}\p{N}]+[\r\n]*` at the start of s (0: no match).
func punct(s string) int {
	start := 0
	if len(s) > 0 && s[0] == ' ' {
		start = 1
	}
	n := runOf(s[start:], isPunct, 0)
	if n == 0 {
		return 0
	}
	end := start + n
	return end + runOf(s[end:], isNewline, 0)
}

func isPunct(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// spaces matches `\s*[\r\n]+|\s+(?!\S)|\s+` at the start of s, which begins
// with whitespace.
func spaces(s string) int {
	run := runOf(s, isSpace, 0)
	// \s*[\r\n]+ : up to the last newline of the run.
	lastNL := -1
	for i, r := range s[:run] {
		if isNewline(r) {
			lastNL = i
		}
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	// \s+(?!\S) : the run, less its last rune unless it ends s.
	if run == len(s) {
		return run
	}
	_, last := utf8.DecodeLastRuneInString(s[:run])
	if run-last > 0 {
		return run - last
	}
	return run // \s+
}

// gpt2Split is the scanner of GPT-2's byte-level pattern
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func gpt2Split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		n := contraction(s[i:], false)
		if n == 0 {
			n = gpt2Rest(s[i:])
		}
		emit(s[i : i+n])
		i += n
	}
}

func gpt2Rest(s string) int {
	start := 0
	if s[0] == ' ' && len(s) > 1 {
		start = 1
	}
	for _, class := range []func(rune) bool{isLetter, isNumber, isPunct} {
		if n := runOf(s[start:], class, 0); n > 0 {
			return start + n
		}
	}
	run := runOf(s, isSpace, 0)
	if run == len(s) {
		return run
	}
	_, last := utf8.DecodeLastRuneInString(s[:run])
	if run-last > 0 {
		return run - last
	}
	return run
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at the start of s, ignoring
// case (with Unicode simple folding, as the reference's (?i:) does) when
// fold is set.
func contraction(s string, fold bool) int {
	if len(s) < 2 || s[0] != '\'' {
		return 0
	}
	for _, suffix := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
		if n := hasPrefixFold(s[1:], suffix, fold); n > 0 {
			return 1 + n
		}
	}
	return 0
}

// hasPrefixFold returns the byte length of the prefix of s that equals
// lower (ASCII lowercase letters), or 0.
func hasPrefixFold(s, lower string, fold bool) int {
	n := 0
	for _, want := range lower {
		r, size := utf8.DecodeRuneInString(s[n:])
		if size == 0 || !(r == want || fold && equalFold(r, want)) {
			return 0
		}
		n += size
	}
	return n
}

func equalFold(r, lower rune) bool {
	for f := unicode.SimpleFold(lower); f != lower; f = unicode.SimpleFold(f) {
		if f == r {
			return true
		}
	}
	return false
}

// runOf returns the byte length of the run of runes in class at the start of
// s, at most limit runes (0: no limit).
func runOf(s string, class func(rune) bool, limit int) int {
	n, count := 0, 0
	for n < len(s) && (limit == 0 || count < limit) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if !class(r) {
			break
		}
		n += size
		count++
	}
	return n
}
