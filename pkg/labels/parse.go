package labels

import (
	"fmt"
	"slices"
	"strings"
)

// tokenKind classifies lexical tokens of a selector.
type tokenKind int

const (
	tokEOF tokenKind = iota
	tokIdent
	tokEquals    // = or ==
	tokNotEquals // !=
	tokBang      // !
	tokOpen      // (
	tokClose     // )
	tokComma     // ,
)

// token is one lexical token and its byte offset in the input.
type token struct {
	kind tokenKind
	text string
	pos  int
}

// describe names t for error messages.
func (t token) describe() string {
	if t.kind == tokEOF {
		return "end of input"
	}
	return fmt.Sprintf("%q", t.text)
}

// lex splits s into tokens, ending with tokEOF. Identifiers are runs of
// characters other than whitespace and ",()=!"; their validity is checked by
// the parser.
func lex(s string) []token {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case isSpace(c):
			i++
		case c == ',':
			toks = append(toks, token{tokComma, ",", i})
			i++
		case c == '(':
			toks = append(toks, token{tokOpen, "(", i})
			i++
		case c == ')':
			toks = append(toks, token{tokClose, ")", i})
			i++
		case c == '=':
			n := 1
			if i+1 < len(s) && s[i+1] == '=' {
				n = 2
			}
			toks = append(toks, token{tokEquals, s[i : i+n], i})
			i += n
		case c == '!':
			if i+1 < len(s) && s[i+1] == '=' {
				toks = append(toks, token{tokNotEquals, "!=", i})
				i += 2
			} else {
				toks = append(toks, token{tokBang, "!", i})
				i++
			}
		default:
			j := i
			for j < len(s) && !isSpace(s[j]) && !strings.ContainsRune(",()=!", rune(s[j])) {
				j++
			}
			toks = append(toks, token{tokIdent, s[i:j], i})
			i = j
		}
	}
	return append(toks, token{tokEOF, "", len(s)})
}

// isSpace reports whether c is ASCII whitespace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// parser consumes the tokens of one selector.
type parser struct {
	input string
	toks  []token
	i     int
}

// next consumes and returns the next token.
func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

// peek returns the next token without consuming it.
func (p *parser) peek() token { return p.toks[p.i] }

// errorf reports a problem at token t, giving its 1-based column.
func (p *parser) errorf(t token, format string, args ...any) error {
	return fmt.Errorf("parse selector %q: column %d: %s", p.input, t.pos+1, fmt.Sprintf(format, args...))
}

// Parse parses a selector (see the package documentation for the syntax).
// The empty or all-whitespace string gives the empty selector. Errors give
// the 1-based column of the offending token and what was expected.
func Parse(s string) (Selector, error) {
	p := &parser{input: s, toks: lex(s)}
	if p.peek().kind == tokEOF {
		return Selector{}, nil
	}
	var sel Selector
	for {
		r, err := p.requirement()
		if err != nil {
			return Selector{}, err
		}
		sel.reqs = append(sel.reqs, r)
		switch t := p.next(); t.kind {
		case tokEOF:
			return sel, nil
		case tokComma:
		default:
			return Selector{}, p.errorf(t, "expected ',' or end of input after requirement, found %s", t.describe())
		}
	}
}

// requirement parses one requirement.
func (p *parser) requirement() (requirement, error) {
	if p.peek().kind == tokBang {
		p.next()
		key, err := p.key()
		if err != nil {
			return requirement{}, err
		}
		return requirement{key: key, op: opDoesNotExist}, nil
	}
	key, err := p.key()
	if err != nil {
		return requirement{}, err
	}
	switch t := p.peek(); {
	case t.kind == tokEOF || t.kind == tokComma:
		return requirement{key: key, op: opExists}, nil
	case t.kind == tokEquals || t.kind == tokNotEquals:
		p.next()
		op := opEquals
		if t.kind == tokNotEquals {
			op = opNotEquals
		}
		v := ""
		if vt := p.peek(); vt.kind == tokIdent {
			p.next()
			if err := ValidateValue(vt.text); err != nil {
				return requirement{}, p.errorf(vt, "%v", err)
			}
			v = vt.text
		} else if vt.kind != tokEOF && vt.kind != tokComma {
			return requirement{}, p.errorf(vt, "expected a value after %q, found %s", t.text, vt.describe())
		}
		return requirement{key: key, op: op, values: []string{v}}, nil
	case t.kind == tokIdent && (t.text == "in" || t.text == "notin"):
		p.next()
		op := opIn
		if t.text == "notin" {
			op = opNotIn
		}
		values, err := p.valueSet(t.text)
		if err != nil {
			return requirement{}, err
		}
		return requirement{key: key, op: op, values: values}, nil
	default:
		return requirement{}, p.errorf(t, "expected one of =, ==, !=, in, notin, ',' or end of input after key %q, found %s", key, t.describe())
	}
}

// key parses and validates a label key.
func (p *parser) key() (string, error) {
	t := p.next()
	if t.kind != tokIdent {
		return "", p.errorf(t, "expected a label key, found %s", t.describe())
	}
	if err := ValidateKey(t.text); err != nil {
		return "", p.errorf(t, "%v", err)
	}
	return t.text, nil
}

// valueSet parses "(v1, v2, ...)" after in or notin, returning the sorted,
// distinct values. The set must hold at least one value and no empty ones.
func (p *parser) valueSet(op string) ([]string, error) {
	if t := p.next(); t.kind != tokOpen {
		return nil, p.errorf(t, "expected '(' after %q, found %s", op, t.describe())
	}
	var values []string
	for {
		t := p.next()
		if t.kind != tokIdent {
			return nil, p.errorf(t, "expected a value in the %q set, found %s", op, t.describe())
		}
		if err := ValidateValue(t.text); err != nil {
			return nil, p.errorf(t, "%v", err)
		}
		values = append(values, t.text)
		switch t := p.next(); t.kind {
		case tokComma:
		case tokClose:
			slices.Sort(values)
			return slices.Compact(values), nil
		default:
			return nil, p.errorf(t, "expected ',' or ')' in the %q set, found %s", op, t.describe())
		}
	}
}
