package spec

import (
	"regexp"
	"strings"
)

// Code is a function deployed from source: brisk runs it in a managed
// language runtime (docs/languages.md). The archive is uploaded once
// (POST /v1/code) and named here by its digest; workers fetch it from the
// control plane and keep it by digest.
type Code struct {
	// Language is LangPython or LangNode.
	Language string `json:"language"`
	// Handler names the function brisk calls: MODULE.FUNCTION, the module
	// a path in the archive without its extension (app.handler is
	// app.py's handler, or app.js's export handler; pkg.mod.fn is
	// pkg/mod.py's fn). A Node module whose export is the function itself
	// (module.exports = async (event, context) => ...) is named alone.
	Handler string `json:"handler"`
	// Contract is how the handler is called: ContractLambda (the default;
	// AWS Lambda's handler(event, context)) or ContractHTTP (a request in,
	// status, headers and body out, as OpenFaaS's templates).
	Contract string `json:"contract,omitempty"`
	// Digest is "sha256:" and the hex SHA-256 of the zip archive.
	Digest string `json:"digest"`
}

// Managed languages and handler contracts.
const (
	LangPython     = "python"
	LangNode       = "node"
	ContractLambda = "lambda"
	ContractHTTP   = "http"
)

// Languages lists the managed languages.
var Languages = []string{LangPython, LangNode}

// Code archive limits: Lambda's for a zip uploaded directly (50 MB) would
// put that much into every registry replica's log, so brisk takes less;
// dependencies beyond it belong in an image.
const (
	MaxCodeBytes         = 32 << 20  // the zip
	MaxCodeUnpackedBytes = 256 << 20 // its files, unpacked (Lambda's 250 MB)
	MaxCodeFiles         = 20_000
	// MaxCodeTotalBytes bounds the archives a registry keeps together:
	// every replica holds them in memory.
	MaxCodeTotalBytes = 4 << 30
)

var (
	handlerRE = regexp.MustCompile(`^[A-Za-z_$][A-Za-z0-9_$-]*(\.[A-Za-z_$][A-Za-z0-9_$-]*)*$`)
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ValidDigest accepts "sha256:" and 64 lowercase hex digits.
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// DefaultHandler is the handler a function gets when none is named: Lambda's
// defaults (lambda_function.lambda_handler, index.handler) and OpenFaaS's
// templates' (handler.handle; Node's handler.js exports the function).
func DefaultHandler(lang, contract string) string {
	switch {
	case lang == LangPython && contract == ContractHTTP:
		return "handler.handle"
	case lang == LangPython:
		return "lambda_function.lambda_handler"
	case contract == ContractHTTP:
		return "handler"
	}
	return "index.handler"
}

// SplitHandler splits a handler into its module path (slash-separated, no
// extension) and the name of the function in it ("" for a Node module that
// is the function).
func (c *Code) SplitHandler() (module, name string) {
	if c.Language == LangNode && !strings.Contains(c.Handler, ".") {
		return c.Handler, ""
	}
	i := strings.LastIndexByte(c.Handler, '.')
	if i < 0 {
		return c.Handler, ""
	}
	return strings.ReplaceAll(c.Handler[:i], ".", "/"), c.Handler[i+1:]
}

// ModuleFiles are the archive paths, in order of preference, that the
// handler's module may be.
func (c *Code) ModuleFiles() []string {
	mod, _ := c.SplitHandler()
	if c.Language == LangPython {
		return []string{mod + ".py", mod + "/__init__.py"}
	}
	return []string{mod + ".js", mod + ".mjs", mod + ".cjs", mod + "/index.js"}
}

func (c *Code) applyDefaults() {
	if c.Contract == "" {
		c.Contract = ContractLambda
	}
	if c.Handler == "" {
		c.Handler = DefaultHandler(c.Language, c.Contract)
	}
}

func (c *Code) validate(bad func(field, format string, args ...any) error) error {
	if !contains(Languages, c.Language) {
		return bad("code.language", "%q is not one of %s", c.Language, strings.Join(Languages, ", "))
	}
	if c.Contract != ContractLambda && c.Contract != ContractHTTP {
		return bad("code.contract", "%q is not %q or %q", c.Contract, ContractLambda, ContractHTTP)
	}
	if len(c.Handler) > 255 || !handlerRE.MatchString(c.Handler) {
		return bad("code.handler", "%q: want MODULE.FUNCTION, e.g. app.handler", c.Handler)
	}
	if c.Language == LangPython && !strings.Contains(c.Handler, ".") {
		return bad("code.handler", "%q: a Python handler is MODULE.FUNCTION, e.g. app.handler", c.Handler)
	}
	if !ValidDigest(c.Digest) {
		return bad("code.digest", "%q: want sha256:<64 hex digits>, as POST /v1/code returns", c.Digest)
	}
	return nil
}
