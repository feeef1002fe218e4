package loadgen

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one line of a CDF plot.
type Series struct {
	Name   string
	Values []float64
}

// maxCDFPoints bounds a line: a 170k-point CDF draws the same as 2k.
const maxCDFPoints = 2000

// PlotCDF draws the empirical CDF of each series into a PNG (or any format
// gonum/plot knows from path's extension). With logX the x axis is
// logarithmic and values ≤ 0 are drawn at the smallest positive value.
// Empty series are skipped; with none left it draws an empty plot.
func PlotCDF(path, title, xLabel string, logX bool, series ...Series) (err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = "CDF"
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	floor := math.Inf(1)
	for _, s := range series {
		for _, v := range s.Values {
			if v > 0 && v < floor {
				floor = v
			}
		}
	}
	drawn := 0
	for i, s := range series {
		if len(s.Values) == 0 {
			continue
		}
		pts := cdfPoints(s.Values, logX, floor)
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", path, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		if s.Name != "" {
			p.Legend.Add(s.Name, l)
		}
		drawn++
	}
	p.Legend.Top, p.Legend.Left = false, false
	if logX && drawn > 0 && !math.IsInf(floor, 1) {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// cdfPoints returns (value, fraction ≤ value) at up to maxCDFPoints ranks.
func cdfPoints(values []float64, logX bool, floor float64) plotter.XYs {
	v := slices.Clone(values)
	slices.Sort(v)
	n := len(v)
	step := max(1, n/maxCDFPoints)
	pts := make(plotter.XYs, 0, n/step+2)
	for i := 0; i < n; i += step {
		pts = append(pts, plotter.XY{X: clampLog(v[i], logX, floor), Y: float64(i+1) / float64(n)})
	}
	if last := pts[len(pts)-1]; last.Y < 1 {
		pts = append(pts, plotter.XY{X: clampLog(v[n-1], logX, floor), Y: 1})
	}
	return pts
}

func clampLog(x float64, logX bool, floor float64) float64 {
	if logX && x <= 0 {
		return floor
	}
	return x
}

// XYSeries is one line of points of a trade-off plot.
type XYSeries struct {
	Name string
	X, Y []float64
}

// PlotTradeoff draws each series as a line through its points (in the
// order given) into a PNG: the memory-versus-slowdown plot of `brisk bench
// modes`.
func PlotTradeoff(path, title, xLabel, yLabel string, series ...XYSeries) (err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Add(plotter.NewGrid())
	for i, s := range series {
		pts := make(plotter.XYs, 0, len(s.X))
		for j := range s.X {
			if j < len(s.Y) && !math.IsNaN(s.X[j]) && !math.IsNaN(s.Y[j]) {
				pts = append(pts, plotter.XY{X: s.X[j], Y: s.Y[j]})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", path, err)
		}
		l.Color, sc.Color = plotutil.Color(i), plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		sc.Shape = plotutil.Shape(i)
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
	}
	// Room around the extreme points, which would sit on the axes.
	padX, padY := (p.X.Max-p.X.Min)*0.05+0.01, (p.Y.Max-p.Y.Min)*0.05+0.01
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = p.X.Min-padX, p.X.Max+padX, p.Y.Min-padY, p.Y.Max+padY
	p.X.Tick.Marker, p.Y.Tick.Marker = preciseTicks{}, preciseTicks{}
	p.Legend.Top = true
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// preciseTicks are gonum's default ticks labelled with two decimals: the
// default labels round 2.625 to "2.6" and 2.75 to "2.8", which misplaces
// close values on a zoomed axis.
type preciseTicks struct{}

func (preciseTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', 2, 64)
		}
	}
	return ts
}

// recoverPlot turns a gonum/plot panic (it panics on some degenerate axes)
// into err: a plot must never take a benchmark's results down with it.
func recoverPlot(path string, err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("plotting %s: %v", path, r)
	}
}
