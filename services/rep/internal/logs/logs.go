// Package logs is the cell's log store: every container's output and lifecycle lines, kept per
// container in a size-bounded file under the rep's work dir (the current file and one rotated
// file, like the kubelet's container logs), read back by filter and followed live.
//
// Writers never block: a line goes onto a bounded queue that one goroutine (Run) drains to
// disk; when the queue is full or the disk write fails the line is dropped and counted. The
// files outlive the rep, so a restarted rep serves a container's earlier lines; a container's
// directory is removed once it has been closed (or not written by this rep) for the retention
// period.
package logs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Sources of the lines the cell writes itself.
const (
	// SourceCell labels Gavel's own lifecycle lines ("container created", "crashed: ...").
	SourceCell = "CELL"
	// SourceHealth labels health-check lines.
	SourceHealth = "HEALTH"
	// SourceLRP is the default source of an LRP's processes, as in Cloud Foundry.
	SourceLRP = "APP/PROC/WEB"
	// SourceTaskPrefix, followed by the task guid, is the default source of a task's processes.
	SourceTaskPrefix = "APP/TASK/"
)

// Streams a line comes from.
const (
	// Stdout is the standard output (and the stream of the cell's own lines).
	Stdout = "stdout"
	// Stderr is the standard error.
	Stderr = "stderr"
)

// Defaults of Options.
const (
	// DefaultMaxFileBytes bounds each of a container's two files.
	DefaultMaxFileBytes = 1 << 20
	// DefaultRetention is how long a closed container's lines are kept.
	DefaultRetention = time.Hour
	// MaxLineBytes cuts longer lines (the rest is dropped).
	MaxLineBytes = 16 << 10
	// QueueBytes bounds the text of the lines waiting to be written (with at most queueLines
	// of them): beyond it new lines are dropped.
	QueueBytes = 4 << 20
	queueLines = 8192
	// memQueueLines is the queue of a store in memory (Options.Memory, a sim cell's): its
	// containers write a synthetic line every few seconds, and a sim host runs a hundred cells,
	// so the disk store's queue (about 1 MiB) would be most of each cell's memory.
	memQueueLines = 512
	// subBatches bounds a follower's backlog (each batch at most one write's lines).
	subBatches = 64
	// FlushInterval is how long the writer lets lines gather after the first one of a batch
	// before it writes them and hands them to the followers (earlier once the queue is half
	// full): a container printing a line at a time costs a file write, a follower's wakeup and
	// a StreamLogs message per interval instead of per line, and a follower sees a line at
	// most this much later.
	FlushInterval = 20 * time.Millisecond
	currentFile   = "current.log"
	rotatedFile   = "current.log.1"
)

// Line is one captured line.
type Line struct {
	// Time is when the line was captured.
	Time time.Time `json:"t"`
	// Source is e.g. APP/PROC/WEB, HEALTH or CELL.
	Source string `json:"src"`
	// Stream is Stdout or Stderr.
	Stream string `json:"s"`
	// Index is the LRP instance index (0 for tasks).
	Index int32 `json:"i"`
	// InstanceGuid is the container's guid (the task guid for tasks).
	InstanceGuid string `json:"g"`
	// Text is the line without its newline.
	Text string `json:"m"`
}

// Key names a container's log.
type Key struct {
	// ProcessGuid and Index name an LRP instance; empty for a task.
	ProcessGuid string
	// Index is the LRP instance index.
	Index int32
	// InstanceGuid is the container's guid (the task guid for tasks).
	InstanceGuid string
	// TaskGuid names a task; empty for an LRP instance.
	TaskGuid string
}

// dir is the key's directory under the store's root: lrp/PROCESS_GUID/INDEX/INSTANCE_GUID or
// task/TASK_GUID.
func (k Key) dir() (string, error) {
	parts := []string{"task", k.TaskGuid}
	if k.TaskGuid == "" {
		parts = []string{"lrp", k.ProcessGuid, strconv.Itoa(int(k.Index)), k.InstanceGuid}
	}
	for _, p := range parts[1:] {
		if p == "" || p == "." || p == ".." || filepath.Base(p) != p {
			return "", fmt.Errorf("log key %+v: %q is not a guid", k, p)
		}
	}
	return filepath.Join(parts...), nil
}

// Filter selects containers: an LRP's instances (all, or one index) or a task.
type Filter struct {
	// ProcessGuid selects an LRP's instances.
	ProcessGuid string
	// Index, with AnyIndex false, selects one instance index.
	Index int32
	// AnyIndex selects every index of ProcessGuid.
	AnyIndex bool
	// TaskGuid selects a task.
	TaskGuid string
}

// Matches reports whether k is selected.
func (f Filter) Matches(k Key) bool {
	if f.TaskGuid != "" {
		return k.TaskGuid == f.TaskGuid
	}
	return k.TaskGuid == "" && k.ProcessGuid == f.ProcessGuid && (f.AnyIndex || k.Index == f.Index)
}

// String names what f selects, for errors.
func (f Filter) String() string {
	switch {
	case f.TaskGuid != "":
		return "task " + f.TaskGuid
	case f.AnyIndex:
		return "process guid " + f.ProcessGuid
	default:
		return fmt.Sprintf("process guid %s index %d", f.ProcessGuid, f.Index)
	}
}

// Options configure a Store.
type Options struct {
	// Dir is the store's root directory.
	Dir string
	// MaxFileBytes bounds each of a container's two files (0: DefaultMaxFileBytes).
	MaxFileBytes int64
	// Retention is how long a closed container's files are kept (0: DefaultRetention).
	Retention time.Duration
	// Memory keeps every container's lines in memory instead of on disk, within the same
	// bounds, and forgets them when the rep stops: for simulated cells, whose thousands of
	// containers would otherwise cost the simulation a directory and a file each (the syscalls
	// halved the placement rate of a sim cluster).
	Memory bool
}

// Store keeps the cell's log lines.
type Store struct {
	opts  Options
	queue chan entry
	full  chan struct{} // wakes the writer early: the queue is half full
	done  chan struct{} // closed when Run returns

	mu   sync.Mutex // guards open, subs, mem and the files
	open map[string]*Instance
	subs map[*Subscription]struct{}
	// mem holds each container's lines, by directory, with Options.Memory.
	mem map[string]*memLog

	enc []byte // a line's encoding (writer goroutine only)

	queued  atomic.Int64 // bytes of text in queue
	dropped atomic.Uint64
	written atomic.Uint64
}

type entry struct {
	inst  *Instance
	line  Line
	close bool
}

// New opens the store under o.Dir, creating it.
func New(o Options) (*Store, error) {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if !o.Memory {
		if err := os.MkdirAll(o.Dir, 0o750); err != nil {
			return nil, fmt.Errorf("log dir: %w", err)
		}
	}
	queue := queueLines
	if o.Memory {
		queue = memQueueLines
	}
	return &Store{opts: o, queue: make(chan entry, queue), full: make(chan struct{}, 1), done: make(chan struct{}),
		open: map[string]*Instance{}, subs: map[*Subscription]struct{}{}, mem: map[string]*memLog{}}, nil
}

// Dropped is how many lines were lost: the queue was full or the disk write failed.
func (s *Store) Dropped() uint64 { return s.dropped.Load() }

// Written is how many lines were written to disk.
func (s *Store) Written() uint64 { return s.written.Load() }

// Instance is one container's log, open for writing.
type Instance struct {
	s      *Store
	key    Key
	dir    string // absolute
	source string // default source of the container's processes
	closed atomic.Bool
	size   int64 // of the current file; -1 until stat'ed (writer goroutine only)
	tap    atomic.Pointer[func(Line)]
}

// SetTap makes every later line of the container also go to f (the container's log drains),
// called on the capturing goroutine: f must not block. A nil f removes the tap.
func (i *Instance) SetTap(f func(Line)) {
	if f == nil {
		i.tap.Store(nil)
		return
	}
	i.tap.Store(&f)
}

// Open opens the log of the container k; source is its processes' default source. Lines of a
// key already open go to the same files.
func (s *Store) Open(k Key, source string) (*Instance, error) {
	rel, err := k.dir()
	if err != nil {
		return nil, err
	}
	inst := &Instance{s: s, key: k, dir: filepath.Join(s.opts.Dir, rel), source: source, size: -1}
	if !s.opts.Memory {
		if err := os.MkdirAll(inst.dir, 0o750); err != nil {
			return nil, fmt.Errorf("log dir: %w", err)
		}
	}
	s.mu.Lock()
	s.open[inst.dir] = inst
	if s.opts.Memory && s.mem[inst.dir] == nil {
		s.mem[inst.dir] = &memLog{key: k}
	}
	s.mu.Unlock()
	return inst, nil
}

// Source is the container's default source.
func (i *Instance) Source() string { return i.source }

// Line captures a line of the container; an empty source is the container's default. It never
// blocks: when the queue is full the line is dropped and counted.
func (i *Instance) Line(source, stream, text string) {
	if i == nil || i.closed.Load() {
		return
	}
	if source == "" {
		source = i.source
	}
	if len(text) > MaxLineBytes {
		text = text[:MaxLineBytes]
	}
	l := Line{Time: time.Now().UTC(), Source: source, Stream: stream, Index: i.key.Index, InstanceGuid: i.key.InstanceGuid, Text: text}
	if f := i.tap.Load(); f != nil {
		(*f)(l)
	}
	if i.s.queued.Add(int64(len(text))) > QueueBytes {
		i.s.queued.Add(-int64(len(text)))
		i.s.dropped.Add(1)
		return
	}
	select {
	case i.s.queue <- entry{inst: i, line: l}:
		if len(i.s.queue) >= cap(i.s.queue)/2 || i.s.queued.Load() >= QueueBytes/2 {
			select {
			case i.s.full <- struct{}{}:
			default:
			}
		}
	default:
		i.s.queued.Add(-int64(len(text)))
		i.s.dropped.Add(1)
	}
}

// Cell captures one of the cell's own lifecycle lines.
func (i *Instance) Cell(format string, args ...any) {
	i.Line(SourceCell, Stdout, fmt.Sprintf(format, args...))
}

// Close ends the container's log once the lines before it are written; followers are told.
// Later lines are ignored. It waits for the queue only while the store runs.
func (i *Instance) Close() {
	if i == nil || i.closed.Swap(true) {
		return
	}
	select {
	case i.s.queue <- entry{inst: i, close: true}:
	case <-i.s.done:
		i.s.mu.Lock()
		i.s.closeLocked(i)
		i.s.mu.Unlock()
	}
}

// Run writes queued lines until ctx ends (then the rest of the queue), and removes the files
// of containers closed for longer than the retention period, at start and periodically. A
// batch is what the queue holds FlushInterval after its first line (or once the queue is half
// full): the writer sleeps meanwhile rather than waking for every line.
func (s *Store) Run(ctx context.Context, ready func()) error {
	defer close(s.done)
	s.sweep(time.Now())
	if ready != nil {
		ready()
	}
	tick := time.NewTicker(min(s.opts.Retention/4+time.Second, time.Minute))
	defer tick.Stop()
	linger := time.NewTimer(FlushInterval)
	linger.Stop()
	var batch []entry
	for {
		select {
		case <-ctx.Done():
			s.write(s.drain(batch[:0]))
			return nil
		case now := <-tick.C:
			s.sweep(now)
		case e := <-s.queue:
			linger.Reset(FlushInterval)
			select {
			case <-linger.C:
			case <-s.full:
				linger.Stop()
			case <-ctx.Done():
				linger.Stop()
			}
			batch = s.drain(append(batch[:0], e))
			s.write(batch)
			clear(batch) // the lines are the followers' now; do not keep them alive
		}
	}
}

// drain appends to batch the entries queued now (at most a queue's worth: a container
// printing as fast as the writer takes its lines does not hold the batch open).
func (s *Store) drain(batch []entry) []entry {
	for len(batch) < queueLines {
		select {
		case e := <-s.queue:
			batch = append(batch, e)
		default:
			select {
			case <-s.full: // read: the queue is empty
			default:
			}
			return batch
		}
	}
	return batch
}

// write appends a batch to the files, rotating them by size, then hands it to the followers.
func (s *Store) write(batch []entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := map[*Instance]*bytes.Buffer{}
	var order []*Instance
	var lines []liveLine
	flush := func(i *Instance) {
		if b := files[i]; b != nil && b.Len() > 0 {
			s.append(i, b.Bytes())
			b.Reset()
		}
	}
	for _, e := range batch {
		if e.close {
			flush(e.inst)
			s.closeLocked(e.inst)
			continue
		}
		s.queued.Add(-int64(len(e.line.Text)))
		if m := s.mem[e.inst.dir]; s.opts.Memory && m != nil {
			m.add(e.line, 2*s.opts.MaxFileBytes)
			s.written.Add(1)
			lines = append(lines, liveLine{key: e.inst.key, line: e.line})
			continue
		}
		b := files[e.inst]
		if b == nil {
			b = &bytes.Buffer{}
			files[e.inst] = b
			order = append(order, e.inst)
		}
		s.enc = appendLine(s.enc[:0], e.line)
		if e.inst.size < 0 {
			e.inst.size = fileSize(filepath.Join(e.inst.dir, currentFile))
		}
		if e.inst.size+int64(b.Len()+len(s.enc)) > s.opts.MaxFileBytes {
			flush(e.inst)
			s.rotate(e.inst)
		}
		b.Write(s.enc)
		lines = append(lines, liveLine{key: e.inst.key, line: e.line})
	}
	for _, i := range order {
		flush(i)
	}
	if len(lines) > 0 {
		for sub := range s.subs {
			sub.deliver(lines)
		}
	}
}

// append writes data to i's current file; lines are dropped and counted when it fails.
func (s *Store) append(i *Instance, data []byte) {
	n := uint64(bytes.Count(data, []byte{'\n'}))
	f, err := os.OpenFile(filepath.Join(i.dir, currentFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err == nil {
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.dropped.Add(n)
		i.size = -1
		return
	}
	s.written.Add(n)
	i.size += int64(len(data))
}

// rotate moves i's current file over its rotated one.
func (s *Store) rotate(i *Instance) {
	if i.size <= 0 {
		return
	}
	_ = os.Rename(filepath.Join(i.dir, currentFile), filepath.Join(i.dir, rotatedFile))
	i.size = 0
}

func (s *Store) closeLocked(i *Instance) {
	if s.open[i.dir] == i {
		delete(s.open, i.dir)
		if m := s.mem[i.dir]; m != nil {
			m.closed = time.Now() // the retention period starts now
		} else {
			_ = os.Chtimes(i.dir, time.Now(), time.Now())
		}
	}
	s.notifyEndedLocked(i.key)
}

// Released tells the followers of k that the cell let go of a container whose log was never
// opened (it ended before it was created); Close does it for an open log.
func (s *Store) Released(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyEndedLocked(k)
}

func (s *Store) notifyEndedLocked(k Key) {
	for sub := range s.subs {
		if sub.f.Matches(k) {
			select {
			case sub.ended <- struct{}{}:
			default:
			}
		}
	}
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// sweep removes the directories of containers not open whose last change is older than the
// retention period, and empty parents.
func (s *Store) sweep(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for dir, m := range s.mem {
		if s.open[dir] == nil && !m.closed.IsZero() && now.Sub(m.closed) > s.opts.Retention {
			delete(s.mem, dir)
		}
	}
	if s.opts.Memory {
		return
	}
	dirs, _ := s.dirsLocked(Filter{}, true)
	for _, d := range dirs {
		if s.open[d.path] != nil {
			continue
		}
		if now.Sub(lastChange(d.path)) > s.opts.Retention {
			_ = os.RemoveAll(d.path)
			for p := filepath.Dir(d.path); p != s.opts.Dir && len(p) > len(s.opts.Dir); p = filepath.Dir(p) {
				if os.Remove(p) != nil { // not empty
					break
				}
			}
		}
	}
}

// lastChange is the newest modification time of dir and its files.
func lastChange(dir string) time.Time {
	var t time.Time
	for _, p := range []string{dir, filepath.Join(dir, currentFile), filepath.Join(dir, rotatedFile)} {
		if st, err := os.Stat(p); err == nil && st.ModTime().After(t) {
			t = st.ModTime()
		}
	}
	return t
}

type keyDir struct {
	key  Key
	path string
}

// dirsLocked lists the container directories f selects (all of them with all).
func (s *Store) dirsLocked(f Filter, all bool) ([]keyDir, error) {
	var out []keyDir
	if s.opts.Memory {
		for dir, m := range s.mem {
			if all || f.Matches(m.key) {
				out = append(out, keyDir{key: m.key, path: dir})
			}
		}
		return out, nil
	}
	if all || f.TaskGuid != "" {
		pattern := filepath.Join(s.opts.Dir, "task", "*")
		if !all {
			pattern = filepath.Join(s.opts.Dir, "task", f.TaskGuid)
		}
		ms, err := filepath.Glob(pattern)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			out = append(out, keyDir{key: Key{TaskGuid: filepath.Base(m), InstanceGuid: filepath.Base(m)}, path: m})
		}
	}
	if all || f.TaskGuid == "" {
		guid, index := f.ProcessGuid, strconv.Itoa(int(f.Index))
		if all {
			guid = "*"
		}
		if all || f.AnyIndex {
			index = "*"
		}
		ms, err := filepath.Glob(filepath.Join(s.opts.Dir, "lrp", guid, index, "*"))
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			idx, err := strconv.Atoi(filepath.Base(filepath.Dir(m)))
			if err != nil {
				continue
			}
			out = append(out, keyDir{key: Key{ProcessGuid: filepath.Base(filepath.Dir(filepath.Dir(m))), Index: int32(idx), InstanceGuid: filepath.Base(m)}, path: m})
		}
	}
	return out, nil
}

// Known reports whether the store holds lines, or an open log, of a container f selects.
func (s *Store) Known(f Filter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	dirs, _ := s.dirsLocked(f, false)
	return len(dirs) > 0
}

// OpenFor reports whether a container f selects has its log open.
func (s *Store) OpenFor(f Filter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range s.open {
		if f.Matches(i.key) {
			return true
		}
	}
	return false
}

// Read returns the lines of the containers f selects captured at or after since (zero: all),
// merged by time; with tail >= 0 only the last tail of them.
func (s *Store) Read(f Filter, since time.Time, tail int) ([]Line, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readLocked(f, since, tail)
}

func (s *Store) readLocked(f Filter, since time.Time, tail int) ([]Line, error) {
	dirs, err := s.dirsLocked(f, false)
	if err != nil {
		return nil, err
	}
	var lines []Line
	for _, d := range dirs {
		if m := s.mem[d.path]; m != nil {
			for _, l := range m.lines {
				if !l.Time.Before(since) {
					lines = append(lines, l)
				}
			}
			continue
		}
		for _, name := range []string{rotatedFile, currentFile} {
			ls, err := readFile(filepath.Join(d.path, name), since)
			if err != nil {
				return nil, err
			}
			lines = append(lines, ls...)
		}
	}
	slices.SortStableFunc(lines, func(a, b Line) int { return a.Time.Compare(b.Time) })
	if tail >= 0 && len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return lines, nil
}

// readFile parses a log file, skipping lines before since and any that do not parse (a line
// cut by a crash of the rep).
func readFile(path string, since time.Time) ([]Line, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4*MaxLineBytes)
	for sc.Scan() {
		var l Line
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Time.Before(since) {
			continue
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

type liveLine struct {
	key  Key
	line Line
}

// Subscription follows the lines of the containers a filter selects.
type Subscription struct {
	s       *Store
	f       Filter
	ch      chan []Line
	ended   chan struct{}
	dropped atomic.Uint64
}

// Follow returns the lines Read would, and a subscription to the lines captured after them:
// nothing is missed or repeated between the two.
func (s *Store) Follow(f Filter, since time.Time, tail int) ([]Line, *Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lines, err := s.readLocked(f, since, tail)
	if err != nil {
		return nil, nil, err
	}
	sub := &Subscription{s: s, f: f, ch: make(chan []Line, subBatches), ended: make(chan struct{}, 1)}
	s.subs[sub] = struct{}{}
	return lines, sub, nil
}

// Lines receives batches of new lines. A subscriber that falls behind by more than its buffer
// loses batches (see Dropped); the writer never waits for it.
func (sub *Subscription) Lines() <-chan []Line { return sub.ch }

// Ended receives when a selected container's log closes, or the cell released a selected
// container that never opened one.
func (sub *Subscription) Ended() <-chan struct{} { return sub.ended }

// Dropped returns, and resets, how many lines the subscriber lost by falling behind.
func (sub *Subscription) Dropped() uint64 { return sub.dropped.Swap(0) }

// Close ends the subscription.
func (sub *Subscription) Close() {
	sub.s.mu.Lock()
	delete(sub.s.subs, sub)
	sub.s.mu.Unlock()
}

func (sub *Subscription) deliver(lines []liveLine) {
	var mine []Line
	for _, l := range lines {
		if sub.f.Matches(l.key) {
			mine = append(mine, l.line)
		}
	}
	if len(mine) == 0 {
		return
	}
	select {
	case sub.ch <- mine:
	default:
		sub.dropped.Add(uint64(len(mine)))
	}
}

// memLog is one container's lines kept in memory (Options.Memory), the oldest dropped past
// the store's bound, as rotation does on disk.
type memLog struct {
	key    Key
	lines  []Line
	bytes  int64
	closed time.Time // when its log was closed; zero while open
}

// add appends l, dropping the oldest lines past max bytes of text.
func (m *memLog) add(l Line, max int64) {
	m.lines = append(m.lines, l)
	m.bytes += int64(len(l.Text))
	drop := 0
	for m.bytes > max && drop < len(m.lines)-1 {
		m.bytes -= int64(len(m.lines[drop].Text))
		drop++
	}
	if drop > 0 {
		m.lines = append(m.lines[:0:0], m.lines[drop:]...)
	}
}
