// Package tracefn is brisk's built-in "trace" function: it burns the CPU time
// and touches the memory each request asks for, as the InVitro loader's trace
// function does, and replies in the loader's JSON format.
package tracefn
