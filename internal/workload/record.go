package workload

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Record is one invocation's outcome: a row of the per-invocation CSV.
// Times are microseconds.
type Record struct {
	Phase        int    // 1 warm-up, 2 measured
	Instance     string // the Function field of the reply, as the loader records it
	InvocationID string // min<m>.inv<k>
	StartTime    int64  // unix µs when the request was sent
	RequestedUs  int64  // requested runtime
	ConnUs       int64  // send to the reply's headers (the loader's grpcConnEstablish over HTTP)
	ResponseUs   int64  // send to reply read
	ActualUs     int64  // ExecutionTime reported by the function
	ConnTimeout  bool   // no reply: the request could not be sent or the client gave up
	FuncTimeout  bool   // a reply that is not 200 with a body (the loader's rule)
	MemoryMB     int    // actualMemoryUsage: the function echoes the requested MiB
	MemTimeout   bool   // memoryAllocationTimeout; never set (the loader's column)
	Function     string
	Status       int    // HTTP status, 0 without a reply
	Cold         bool   // X-Brisk-Timing cold=true
	QueueUs      int64  // X-Brisk-Timing queue_us
	Sandbox      string // X-Brisk-Sandbox, else the reply's MachineName
	LatenessUs   int64  // how late the issuer sent it
	Error        string
}

// OK reports whether the invocation succeeded: HTTP 200 with a body (the
// loader's rule; its failures are the timeout flags).
func (r *Record) OK() bool { return r.Status == 200 && r.Error == "" }

// Minute is the column number in the invocation id (min<m>.… or sec<m>.…),
// or -1 when the id has none.
func (r *Record) Minute() int {
	id := r.InvocationID
	var rest string
	if s, ok := strings.CutPrefix(id, "min"); ok {
		rest = s
	} else if s, ok := strings.CutPrefix(id, "sec"); ok {
		rest = s
	} else {
		return -1
	}
	num, _, _ := strings.Cut(rest, ".")
	m, err := strconv.Atoi(num)
	if err != nil {
		return -1
	}
	return m
}

// RecordColumns is the CSV header: the loader's columns, then brisk's.
var RecordColumns = []string{"phase", "instance", "invocationID", "startTime", "requestedDuration",
	"grpcConnEstablish", "responseTime", "actualDuration", "connectionTimeout", "functionTimeout",
	"actualMemoryUsage", "memoryAllocationTimeout",
	"function", "status", "cold", "queue_us", "sandbox", "lateness_us", "error"}

// WriteRecords writes records as CSV with the RecordColumns header.
func WriteRecords(w io.Writer, recs []Record) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	bw.WriteString(strings.Join(RecordColumns, ",") + "\n")
	var b []byte
	for i := range recs {
		r := &recs[i]
		b = strconv.AppendInt(b[:0], int64(r.Phase), 10)
		b = appendField(b, r.Instance)
		b = appendField(b, r.InvocationID)
		b = appendInt(b, r.StartTime)
		b = appendInt(b, r.RequestedUs)
		b = appendInt(b, r.ConnUs)
		b = appendInt(b, r.ResponseUs)
		b = appendInt(b, r.ActualUs)
		b = appendBool(b, r.ConnTimeout)
		b = appendBool(b, r.FuncTimeout)
		b = appendInt(b, int64(r.MemoryMB))
		b = appendBool(b, r.MemTimeout)
		b = appendField(b, r.Function)
		b = appendInt(b, int64(r.Status))
		b = appendBool(b, r.Cold)
		b = appendInt(b, r.QueueUs)
		b = appendField(b, r.Sandbox)
		b = appendInt(b, r.LatenessUs)
		b = appendField(b, r.Error)
		b = append(b, '\n')
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func appendInt(b []byte, v int64) []byte { return strconv.AppendInt(append(b, ','), v, 10) }

func appendBool(b []byte, v bool) []byte { return strconv.AppendBool(append(b, ','), v) }

// appendField writes a string field, quoting it only when CSV needs it.
func appendField(b []byte, s string) []byte {
	b = append(b, ',')
	if !strings.ContainsAny(s, ",\"\r\n") {
		return append(b, s...)
	}
	return append(append(b, '"'), strings.ReplaceAll(s, `"`, `""`)+`"`...)
}

// ReadRecords parses a per-invocation CSV by header name. Besides brisk's
// own files it reads the loader's (columns brisk adds are then zero), so
// the metrics can be recomputed from either.
func ReadRecords(rd io.Reader) ([]Record, error) {
	r := newCSVReader(rd)
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("records: reading header: %w", err)
	}
	col := columnIndex(header)
	for _, need := range []string{"invocationID", "requestedDuration", "responseTime", "actualDuration"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("records: no %s column in header", need)
		}
	}
	_, hasStatus := col["status"]
	var out []Record
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("records: %w", err)
		}
		var perr error
		str := func(name string) string {
			if i, ok := col[name]; ok && i < len(rec) {
				return rec[i]
			}
			return ""
		}
		num := func(name string) int64 {
			s := strings.TrimSpace(str(name))
			if s == "" {
				return 0
			}
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				f, ferr := strconv.ParseFloat(s, 64)
				if ferr != nil {
					perr = cmpOr(perr, fmt.Errorf("records line %d column %s: %q is not a number", line, name, s))
				}
				v = int64(f)
			}
			return v
		}
		flag := func(name string) bool {
			s := strings.TrimSpace(str(name))
			if s == "" {
				return false
			}
			v, err := strconv.ParseBool(s)
			if err != nil {
				perr = cmpOr(perr, fmt.Errorf("records line %d column %s: %q is not a boolean", line, name, s))
			}
			return v
		}
		x := Record{
			Phase: int(num("phase")), Instance: str("instance"), InvocationID: str("invocationID"),
			StartTime: num("startTime"), RequestedUs: num("requestedDuration"), ConnUs: num("grpcConnEstablish"),
			ResponseUs: num("responseTime"), ActualUs: num("actualDuration"), ConnTimeout: flag("connectionTimeout"),
			FuncTimeout: flag("functionTimeout"), MemoryMB: int(num("actualMemoryUsage")), MemTimeout: flag("memoryAllocationTimeout"),
			Function: str("function"), Status: int(num("status")), Cold: flag("cold"), QueueUs: num("queue_us"),
			Sandbox: str("sandbox"), LatenessUs: num("lateness_us"), Error: str("error"),
		}
		if x.Function == "" {
			x.Function = x.Instance // a loader file: its instance is the function name
		}
		if !hasStatus { // a loader file: success is the absence of timeouts
			x.Status = 200
			if x.ConnTimeout || x.FuncTimeout {
				x.Status = 0
			}
		}
		if x.Phase == 0 {
			x.Phase = 2
		}
		if perr != nil {
			return nil, perr
		}
		out = append(out, x)
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
