package policy

import (
	"strings"
)

// warnPolicyCollisions warns when limits of two different rules of one
// domain have the same RateLimit-Policy name (an explicit name reused, or a
// name equal to another rule's derived descriptor path): a client then
// cannot tell from RateLimit-Policy / RateLimit which limit it hit. Limits
// of one rule are checked at parse (a duplicate name there is an error).
func warnPolicyCollisions(rules []*Rule, errs *errList) {
	type pos struct {
		rule *Rule
		file string
		line int
	}
	seen := map[string]pos{}
	for _, r := range rules {
		n := r.nodes[len(r.nodes)-1]
		for i, sp := range r.Limits {
			line := r.Line
			if i < len(n.limits) {
				line = n.limits[i].line
			}
			f, dup := seen[sp.Policy]
			if !dup {
				seen[sp.Policy] = pos{r, r.File, line}
				continue
			}
			if f.rule != r {
				errs.warn(r.File, line, "RateLimit-Policy name %q of descriptor %q is also used by descriptor %q (%s): clients cannot tell the two limits apart; give one a different name", sp.Policy, r.Path, f.rule.Path, formatPos(f.file, f.line))
			}
		}
	}
}

// authWords are the whole words (after splitting keys and values into
// words, see words) that make a descriptor look like an authentication
// endpoint for the fixed_window lint. Authorization words (authz,
// authorization) and plural or compound forms (tokens, author, hotpath)
// are deliberately absent: only exact authentication words count, so
// llm_tokens or author_id do not warn.
var authWords = map[string]bool{
	"login": true, "logon": true, "signin": true,
	"password": true, "passwd": true, "pwd": true,
	"auth": true, "authn": true, "authenticate": true, "authentication": true,
	"otp": true, "totp": true, "mfa": true, "2fa": true,
	"token": true,
}

// authPairs are two consecutive words that form an authentication word
// when written apart: sign_in, logIn, log-on, pass_word.
var authPairs = map[[2]string]bool{
	{"sign", "in"}: true, {"log", "in"}: true, {"log", "on"}: true, {"pass", "word"}: true,
}

// words splits s into lower-case words: at every byte that is not an ASCII
// letter or digit, and at camelCase boundaries (a lower-case letter or digit
// followed by an upper-case letter, a digit after a letter followed by an
// upper-case letter, and the last letter of an upper-case run followed by a
// lower-case letter: "OTPCode" → otp, code; "v1Login" → v1, login; "2FA"
// stays 2fa). "/api/v1/signIn" → api, v1, sign, in.
func words(s string) []string {
	var out []string
	isUpper := func(c byte) bool { return c >= 'A' && c <= 'Z' }
	isLower := func(c byte) bool { return c >= 'a' && c <= 'z' }
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	start := -1
	flush := func(end int) {
		if start >= 0 && end > start {
			out = append(out, strings.ToLower(s[start:end]))
		}
		start = -1
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isUpper(c) && !isLower(c) && !isDigit(c) {
			flush(i)
			continue
		}
		if start >= 0 && isUpper(c) {
			p := s[i-1]
			digitAfterLetter := isDigit(p) && strings.ContainsFunc(s[start:i], func(r rune) bool { return r > '9' })
			if isLower(p) || digitAfterLetter || (isUpper(p) && i+1 < len(s) && isLower(s[i+1])) {
				flush(i)
			}
		}
		if start < 0 {
			start = i
		}
	}
	flush(len(s))
	return out
}

// looksLikeAuth returns the first key or value along path that contains an
// authentication word (authWords, authPairs), or "".
func looksLikeAuth(path []*node) string {
	for _, n := range path {
		for _, s := range [2]string{n.key, n.value} {
			ws := words(s)
			for i, w := range ws {
				if authWords[w] || (i+1 < len(ws) && authPairs[[2]string{w, ws[i+1]}]) {
					return s
				}
			}
		}
	}
	return ""
}
