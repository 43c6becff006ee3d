// Package models holds hand-written helpers on the generated gavel.models.v1 types: request
// validation with full field paths, the split of a DesiredLRP into its scheduling and run halves,
// the redaction of secret env values, and Diego's crash restart policy.
package models
